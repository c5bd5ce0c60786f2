package main

import "fmt"

// bashCompletion completes commands, flags, lock names (from list, for the
// commands that take one) and COMMAND after exec's "--".
const bashCompletion = `# bash completion for coordctl; load it with: source <(coordctl completion bash)
_coordctl() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    local conn="--addr --tls --tls-ca --tls-cert --tls-key --tls-server-name --token-file --timeout -o"
    local cmds="acquire release keepalive validate describe list watch force-release exec completion help"
    local cmd="" i
    for ((i = 1; i < COMP_CWORD; i++)); do
        if [[ "${COMP_WORDS[i]}" == "--" ]]; then
            # exec's COMMAND: complete commands, then files
            if ((i == COMP_CWORD - 1)); then COMPREPLY=($(compgen -c -- "$cur")); else COMPREPLY=($(compgen -f -- "$cur")); fi
            return
        fi
        case " $cmds " in *" ${COMP_WORDS[i]} "*) cmd="${COMP_WORDS[i]}"; break ;; esac
    done
    case "$prev" in
        -o) COMPREPLY=($(compgen -W "table json" -- "$cur")); return ;;
        --tls-ca|--tls-cert|--tls-key|--token-file|-tls-ca|-tls-cert|-tls-key|-token-file) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        --addr|--timeout|--ttl|--wait|--owner|--lock-delay|--max-hold|--grace|--resource|--count|--start-revision|--tls-server-name) return ;;
    esac
    if [[ -z "$cmd" ]]; then
        if [[ "$cur" == -* ]]; then COMPREPLY=($(compgen -W "$conn" -- "$cur")); else COMPREPLY=($(compgen -W "$cmds" -- "$cur")); fi
        return
    fi
    local flags="$conn"
    case "$cmd" in
        acquire) flags="$flags --ttl --wait --owner --lock-delay --max-hold" ;;
        exec) flags="$flags --ttl --wait --owner --lock-delay --max-hold --grace --" ;;
        validate) flags="$flags --resource" ;;
        watch) flags="$flags --count --start-revision" ;;
        completion) COMPREPLY=($(compgen -W "bash" -- "$cur")); return ;;
        help) COMPREPLY=($(compgen -W "$cmds" -- "$cur")); return ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$flags" -- "$cur"))
        return
    fi
    case "$cmd" in
        acquire|release|keepalive|validate|describe|watch|force-release|exec|list)
            # lock names currently held, from the coordinator (quietly; 2s at most)
            local names
            names=$(coordctl --timeout 2s list 2>/dev/null | awk 'NR > 1 {print $1}')
            COMPREPLY=($(compgen -W "$names" -- "$cur")) ;;
    esac
}
complete -o default -F _coordctl coordctl
`

func cmdCompletion(e *env, args []string) int {
	if len(args) != 1 || args[0] != "bash" {
		fmt.Fprintln(e.stderr, "Usage: coordctl completion bash\n\nPrints a bash completion script; load it with: source <(coordctl completion bash)")
		if len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			return exitOK
		}
		return exitUsage
	}
	fmt.Fprint(e.stdout, bashCompletion)
	return exitOK
}
