package main

import (
	"slices"
	"testing"
)

func TestEditDistance(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"ttl", "ttl", 0},
		{"tll", "ttl", 1},        // a substitution
		{"aquire", "acquire", 1}, // an insertion
		{"relase", "release", 1},
		{"opne", "open", 1}, // a swap of neighbours
		{"watch", "", 5},
		{"é", "e", 1}, // runes, not bytes
	}
	for _, tt := range tests {
		if got := editDistance(tt.a, tt.b); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}

func TestSuggest(t *testing.T) {
	cmds := commandWords("")
	tests := []struct {
		word string
		in   []string
		want []string
	}{
		{"aquire", cmds, []string{"acquire"}},
		{"desc", cmds, []string{"describe"}},
		{"LIST", cmds, []string{"list"}},
		{"list", cmds, nil},                                  // itself is no suggestion, nor is hit (2 edits)
		{"rest", commandWords("counter"), []string{"reset"}}, // not get (2 edits in 4 letters)
		{"x", cmds, nil},                                     // one letter is too little to guess from
		{"frobnicate", cmds, nil},                            // nothing close
		{"__names", cmds, nil},                               // hidden commands are never offered
		{"opne", commandWords("session"), []string{"open"}},
		{"e", []string{"epoch", "exec", "echo", "edit", "else"}, nil},
		{"e", []string{"e1", "e2"}, nil},
		{"ab", []string{"abc", "abd", "abe", "abf"}, []string{"abc", "abd", "abe"}}, // at most three
	}
	for _, tt := range tests {
		if got := suggest(tt.word, tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("suggest(%q) = %q, want %q", tt.word, got, tt.want)
		}
	}
	if got := didYouMean("ab", []string{"abc", "abd"}, "--"); got != "did you mean --abc or --abd?" {
		t.Errorf("didYouMean: %q", got)
	}
}
