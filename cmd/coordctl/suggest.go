package main

import (
	"flag"
	"slices"
	"strings"
)

// "Did you mean": after an unknown command or flag, the names it is
// probably a typo of, as cobra suggests commands: one edit per three
// letters typed, two at most (a swap of two neighbours counts as one:
// "opne" is "open"; "list" is not "hit"), or starting with what was typed
// ("desc" is "describe"). Case is ignored.

// maxSuggestions bounds a suggestion's list: past three, it is a guess.
const maxSuggestions = 3

// didYouMean is "did you mean X?" (X, Y or Z), or "" when no candidate
// is close to word; prefix is put before each name ("--" for a flag).
func didYouMean(word string, candidates []string, prefix string) string {
	near := suggest(word, candidates)
	if len(near) == 0 {
		return ""
	}
	for i := range near {
		near[i] = prefix + near[i]
	}
	list := near[0]
	if n := len(near); n > 1 {
		list = strings.Join(near[:n-1], ", ") + " or " + near[n-1]
	}
	return "did you mean " + list + "?"
}

// hint is "; s", or "" for no s: a suggestion after a message.
func hint(s string) string {
	if s == "" {
		return ""
	}
	return "; " + s
}

// suggest returns the candidates close to word, the closest first, at
// most maxSuggestions.
func suggest(word string, candidates []string) []string {
	type near struct {
		name string
		d    int
	}
	var found []near
	w := strings.ToLower(word)
	for _, c := range candidates {
		if c == word {
			continue
		}
		lc := strings.ToLower(c)
		d := editDistance(w, lc)
		if d <= min(2, len(w)/3) || len(w) >= 2 && strings.HasPrefix(lc, w) {
			found = append(found, near{c, d})
		}
	}
	slices.SortStableFunc(found, func(a, b near) int { return a.d - b.d })
	var out []string
	for _, f := range found {
		if !slices.Contains(out, f.name) {
			out = append(out, f.name)
		}
	}
	return out[:min(len(out), maxSuggestions)]
}

// editDistance is the optimal string alignment distance of a and b: the
// insertions, deletions, substitutions and swaps of two neighbouring
// runes that turn one into the other.
func editDistance(a, b string) int {
	x, y := []rune(a), []rune(b)
	d := make([][]int, len(x)+1)
	for i := range d {
		d[i] = make([]int, len(y)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(x); i++ {
		for j := 1; j <= len(y); j++ {
			cost := 1
			if x[i-1] == y[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && x[i-1] == y[j-2] && x[i-2] == y[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(x)][len(y)]
}

// commandWords are the words that may follow "coordctl" (or, with group,
// "coordctl GROUP"): the table's commands, help and completion.
func commandWords(group string) []string {
	var words []string
	if group == "" {
		words = append(words, "help", "completion")
	}
	for _, c := range commands {
		if c.hidden {
			continue
		}
		first, rest, grouped := strings.Cut(c.name, " ")
		switch {
		case group == "" && !slices.Contains(words, first):
			words = append(words, first)
		case group != "" && grouped && first == group:
			words = append(words, rest)
		}
	}
	return words
}

// flagNames are the names of fs's flags.
func flagNames(fs *flag.FlagSet) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return names
}

// undefinedFlag is the name in the flag package's error for a flag fs does
// not define ("flag provided but not defined: -tll"), or "".
func undefinedFlag(err error) string {
	name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -")
	if !ok {
		return ""
	}
	return name
}
