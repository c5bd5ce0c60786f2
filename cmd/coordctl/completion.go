package main

import (
	"fmt"
	"io"
)

// bashCompletion completes commands, flags, lock names (held ones, from
// "coordctl __names", for the commands that take one) and COMMAND after
// exec's "--".
//
// A lock name is data from the coordinator, which any client with the right
// to acquire can choose: the script never lets bash expand it. compgen -W
// would (it splits and expands its word list, so a lock named
// x$(touch${IFS}pwned) ran touch on the operator's machine at TAB). Names
// arrive NUL-separated (a name may hold spaces, quotes, even newlines), are
// compared with the word being completed as plain strings, and are offered
// printf-%q-quoted: the word TAB inserts is the name itself to the shell
// that runs the line, and running it expands nothing.
const bashCompletion = `# bash completion for coordctl; load it with: source <(coordctl completion bash)
_coordctl() {
    COMPREPLY=()
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    local conn="--addr --tls --tls-ca --tls-cert --tls-key --tls-server-name --token-file --timeout -o"
    local cmds="acquire release keepalive validate describe list watch force-release session marks hit counter exec epoch restore-plan version completion help"
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
        --tls-ca|--tls-cert|--tls-key|--token-file|--handle-file|--session-file|-tls-ca|-tls-cert|-tls-key|-token-file|-handle-file|-session-file) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        --addr|--timeout|--ttl|--wait|--owner|--lock-delay|--max-hold|--grace|--resource|--count|--start-revision|--tls-server-name|--limit|--window|--hits|--request-id|--slot|--last-revision|--margin) return ;;
    esac
    if [[ -z "$cmd" ]]; then
        if [[ "$cur" == -* ]]; then COMPREPLY=($(compgen -W "$conn --version" -- "$cur")); else COMPREPLY=($(compgen -W "$cmds" -- "$cur")); fi
        return
    fi
    local flags="$conn"
    case "$cmd" in
        acquire) flags="$flags --ttl --wait --owner --lock-delay --max-hold --limit --shared --session --session-file" ;;
        release|keepalive) flags="$flags --handle-file" ;;
        session|marks|counter)
            # the group's commands, then their flags (no names: a session, a mark or a counter is not a lock)
            local sub="${COMP_WORDS[i+1]}"
            if ((COMP_CWORD == i + 1)); then
                case "$cmd" in
                    session) COMPREPLY=($(compgen -W "open keepalive close" -- "$cur")) ;;
                    marks) COMPREPLY=($(compgen -W "list get delete rebind" -- "$cur")) ;;
                    *) COMPREPLY=($(compgen -W "get reset" -- "$cur")) ;;
                esac
                return
            fi
            case "$cmd $sub" in
                "session open") flags="$flags --ttl --owner" ;;
                "session keepalive"|"session close") flags="$flags --session-file" ;;
                "marks get"|"marks delete"|"marks rebind") flags="$flags --slot" ;;
            esac
            if [[ "$cur" == -* ]]; then COMPREPLY=($(compgen -W "$flags" -- "$cur")); fi
            return ;;
        exec) flags="$flags --ttl --wait --owner --lock-delay --max-hold --limit --shared --grace --" ;;
        restore-plan) flags="$flags --last-revision --margin" ;;
        validate) flags="$flags --resource" ;;
        watch) flags="$flags --count --start-revision" ;;
        hit) flags="$flags --limit --window --hits --token-bucket --fail-open --request-id" ;;
        completion) COMPREPLY=($(compgen -W "bash zsh fish" -- "$cur")); return ;;
        help) COMPREPLY=($(compgen -W "$cmds" -- "$cur")); return ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$flags" -- "$cur"))
        return
    fi
    case "$cmd" in
        acquire|release|keepalive|validate|describe|watch|force-release|exec|list)
            # Lock names currently held, from the coordinator (quietly; 2s at most).
            # Data, never code: read NUL-separated, matched as strings, offered %q-quoted.
            # COMP_WORDS cuts a word at : = @ (COMP_WORDBREAKS), and readline then
            # replaces only the text after the last : or =, or from the last @ on:
            # match on the word glued back together, offer what readline replaces.
            local n q word="$cur" piece="$cur" prefix="" line="${COMP_LINE:0:COMP_POINT}"
            if [[ "$cur" =~ ^[:=]+$ ]]; then piece=""; fi
            for ((i = COMP_CWORD; i > 1; i--)); do
                [[ "${COMP_WORDS[i]}" =~ ^[:=@]+$ || "${COMP_WORDS[i-1]}" =~ ^[:=@]+$ ]] || break
                [[ "$line" == *"${COMP_WORDS[i-1]}$word" ]] || break
                word="${COMP_WORDS[i-1]}$word"
            done
            local cut="${word:0:${#word}-${#piece}}"
            if [[ "$word" =~ ^[A-Za-z0-9/._:=@-]*$ ]]; then prefix="$word"; fi
            while IFS= read -r -d '' n; do
                printf -v q '%q' "$n"
                if [[ "$n" == "$word"* || "$q" == "$word"* ]] && [[ "$q" == "$cut"* ]]; then COMPREPLY+=("${q#"$cut"}"); fi
            done < <(coordctl --timeout 2s __names "$prefix" 2>/dev/null) ;;
    esac
}
complete -o default -F _coordctl coordctl
`

// completionScripts are the scripts of "coordctl completion SHELL".
var completionScripts = map[string]string{"bash": bashCompletion, "zsh": zshCompletion, "fish": fishCompletion}

func cmdCompletion(e *env, args []string) int {
	script, ok := "", len(args) == 1
	if ok {
		script, ok = completionScripts[args[0]]
	}
	if !ok {
		fmt.Fprintln(e.stderr, "Usage: coordctl completion bash|zsh|fish\n\nPrints a completion script; load it with:\n  bash: source <(coordctl completion bash)\n  zsh:  source <(coordctl completion zsh)   (after compinit)\n  fish: coordctl completion fish | source")
		if len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			return exitOK
		}
		return exitUsage
	}
	if _, err := io.WriteString(e.stdout, script); err != nil {
		fmt.Fprintln(e.stderr, "coordctl completion:", err)
		return exitError
	}
	return exitOK
}
