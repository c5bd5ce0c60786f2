package main

// zshCompletion and fishCompletion complete what bashCompletion does:
// commands, flags, held lock names (from "coordctl __names") and COMMAND
// after exec's "--", with the same guarantee: a lock name is data, never
// code. Names arrive NUL-separated and go to the shell's own completion
// as a list of strings (zsh: compadd, which quotes each match it inserts;
// fish: a command substitution split with string split0, whose items fish
// escapes when it inserts one); no name is ever part of a string the shell
// parses, so no $(...), backtick, quote or ; in one runs anything.

const zshCompletion = `#compdef coordctl
# zsh completion for coordctl; load it with: source <(coordctl completion zsh)
# (after compinit).
_coordctl() {
    local -a cmds conn flags names
    cmds=(acquire release keepalive validate describe list watch force-release session marks hit counter exec epoch restore-plan version completion help)
    conn=(--addr --tls --tls-ca --tls-cert --tls-key --tls-server-name --token-file --timeout -o)
    local cmd="" sub="" i
    for ((i = 2; i < CURRENT; i++)); do
        if [[ "${words[i]}" == "--" ]]; then
            # exec's COMMAND: complete commands, then files
            if ((i == CURRENT - 1)); then _command_names; else _files; fi
            return
        fi
        if (( ${cmds[(Ie)${words[i]}]} )); then cmd="${words[i]}"; sub="${words[i+1]}"; break; fi
    done
    case "${words[CURRENT-1]}" in
        -o) compadd -- table json; return ;;
        --tls-ca|--tls-cert|--tls-key|--token-file|--handle-file|--session-file) _files; return ;;
        --addr|--timeout|--ttl|--wait|--owner|--lock-delay|--max-hold|--grace|--resource|--count|--start-revision|--tls-server-name|--limit|--window|--hits|--request-id|--slot|--last-revision|--margin) return ;;
    esac
    if [[ -z "$cmd" ]]; then
        if [[ "$PREFIX" == -* ]]; then compadd -- $conn --version; else compadd -- $cmds; fi
        return
    fi
    flags=($conn)
    case "$cmd" in
        acquire) flags+=(--ttl --wait --owner --lock-delay --max-hold --limit --shared --session --session-file) ;;
        release|keepalive) flags+=(--handle-file) ;;
        exec) flags+=(--ttl --wait --owner --lock-delay --max-hold --limit --shared --grace --) ;;
        restore-plan) flags+=(--last-revision --margin) ;;
        validate) flags+=(--resource) ;;
        watch) flags+=(--count --start-revision) ;;
        session)
            if ((CURRENT == i + 1)); then compadd -- open keepalive close; return; fi
            case "$sub" in open) flags+=(--ttl --owner) ;; keepalive|close) flags+=(--session-file) ;; esac ;;
        marks)
            if ((CURRENT == i + 1)); then compadd -- list get delete rebind; return; fi
            case "$sub" in get|delete|rebind) flags+=(--slot) ;; esac ;;
        counter)
            if ((CURRENT == i + 1)); then compadd -- get reset; return; fi ;;
        hit) flags+=(--limit --window --hits --token-bucket --fail-open --request-id) ;;
        completion) compadd -- bash zsh fish; return ;;
        help) compadd -- $cmds; return ;;
    esac
    if [[ "$PREFIX" == -* ]]; then compadd -- $flags; return; fi
    case "$cmd" in
        acquire|release|keepalive|validate|describe|watch|force-release|exec|list)
            # Lock names currently held, from the coordinator (quietly; 2s at most).
            # Data, never code: split at NUL bytes into an array, given to compadd
            # as strings; compadd matches them as strings and quotes the one inserted.
            names=(${(0)"$(coordctl --timeout 2s __names "${(Q)PREFIX}" 2>/dev/null)"})
            compadd -- "${names[@]}" ;;
    esac
}
if (( $+functions[compdef] )); then compdef _coordctl coordctl; fi
`

const fishCompletion = `# fish completion for coordctl; load it with: coordctl completion fish | source
function __coordctl_cmd --description 'the command being completed (session, marks and counter: with their subcommand)'
    set -l toks (commandline -opc)
    set -e toks[1]
    set -l cmds acquire release keepalive validate describe list watch force-release session marks hit counter exec epoch restore-plan version completion help
    for i in (seq (count $toks))
        if test "$toks[$i]" = "--"
            echo --
            return
        end
        if contains -- $toks[$i] $cmds
            set -l next (math $i + 1)
            if contains -- $toks[$i] session marks counter; and test (count $toks) -ge $next
                echo "$toks[$i] $toks[$next]"
            else
                echo $toks[$i]
            end
            return
        end
    end
end
function __coordctl_is --description 'is the command being completed one of the arguments?'
    set -l c (__coordctl_cmd)
    test -n "$c"; and contains -- "$c" $argv
end
# Lock names currently held, from the coordinator (quietly; 2s at most). Data,
# never code: NUL-separated, split with string split0 into list items, which
# fish matches as strings and escapes when it inserts one.
function __coordctl_names
    coordctl --timeout 2s __names (commandline -ct) 2>/dev/null | string split0
end
complete -c coordctl -f
complete -c coordctl -n 'test -z (__coordctl_cmd)' -a 'acquire release keepalive validate describe list watch force-release session marks hit counter exec epoch restore-plan version completion help'
complete -c coordctl -n '__coordctl_is session' -a 'open keepalive close'
complete -c coordctl -n '__coordctl_is marks' -a 'list get delete rebind'
complete -c coordctl -n '__coordctl_is counter' -a 'get reset'
complete -c coordctl -n '__coordctl_is completion' -a 'bash zsh fish'
complete -c coordctl -n '__coordctl_is help' -a 'acquire release keepalive validate describe list watch force-release session marks hit counter exec epoch restore-plan version completion'
complete -c coordctl -n '__coordctl_is acquire release keepalive validate describe watch force-release exec list' -a '(__coordctl_names)'
complete -c coordctl -n '__coordctl_is --' -a '(__fish_complete_subcommand --fcs-skip=1)'
complete -c coordctl -o o -x -a 'table json' -d 'output format'
complete -c coordctl -n 'test -z (__coordctl_cmd)' -l version -d "coordctl's version"
complete -c coordctl -l addr -x -d 'coordinator address'
complete -c coordctl -l timeout -x -d 'bound on each call'
complete -c coordctl -l tls -d 'TLS with the system roots'
complete -c coordctl -l tls-ca -r -F -d 'PEM CA bundle'
complete -c coordctl -l tls-cert -r -F -d 'PEM client certificate'
complete -c coordctl -l tls-key -r -F -d 'PEM key of --tls-cert'
complete -c coordctl -l tls-server-name -x -d 'server name to verify'
complete -c coordctl -l token-file -r -F -d 'bearer token file'
complete -c coordctl -n '__coordctl_is acquire exec' -l ttl -x -d 'lease TTL'
complete -c coordctl -n '__coordctl_is acquire exec' -l wait -x -d 'queue wait'
complete -c coordctl -n '__coordctl_is acquire exec' -l owner -x -d 'who holds the lock'
complete -c coordctl -n '__coordctl_is acquire exec' -l lock-delay -x
complete -c coordctl -n '__coordctl_is acquire exec' -l max-hold -x
complete -c coordctl -n '__coordctl_is acquire exec' -l limit -x -d 'a semaphore of this many permits'
complete -c coordctl -n '__coordctl_is acquire exec' -l shared -d 'as a read-write lock reader'
complete -c coordctl -n '__coordctl_is exec' -l grace -x -d 'SIGKILL after SIGTERM'
complete -c coordctl -n '__coordctl_is "marks get" "marks delete" "marks rebind"' -l slot -x -d 'a semaphore slot mark'
complete -c coordctl -n '__coordctl_is hit' -l limit -x -d 'most hits per window'
complete -c coordctl -n '__coordctl_is hit' -l window -x -d 'window length'
complete -c coordctl -n '__coordctl_is hit' -l hits -x -d 'hits to count'
complete -c coordctl -n '__coordctl_is hit' -l token-bucket -d 'token bucket'
complete -c coordctl -n '__coordctl_is hit' -l fail-open -d 'allow when etcd is unavailable'
complete -c coordctl -n '__coordctl_is hit' -l request-id -x -d 'idempotency id'
complete -c coordctl -n '__coordctl_is restore-plan' -l last-revision -x
complete -c coordctl -n '__coordctl_is restore-plan' -l margin -x
complete -c coordctl -n '__coordctl_is acquire' -l session -d 'acquire through the session'
complete -c coordctl -n '__coordctl_is acquire "session keepalive" "session close"' -l session-file -r -F -d 'the session handle file'
complete -c coordctl -n '__coordctl_is release keepalive' -l handle-file -r -F -d 'the handle file'
complete -c coordctl -n '__coordctl_is validate' -l resource -x -d 'protected resource'
complete -c coordctl -n '__coordctl_is watch' -l count -x
complete -c coordctl -n '__coordctl_is watch' -l start-revision -x
complete -c coordctl -n '__coordctl_is "session open"' -l ttl -x -d 'session TTL'
complete -c coordctl -n '__coordctl_is "session open"' -l owner -x -d 'who holds the session'
`
