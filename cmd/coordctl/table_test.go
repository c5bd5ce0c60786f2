package main

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestTableMatchesHelpAndCompletion: every command of the table is in the
// help, in the completion script and has examples of itself; nothing else
// is.
func TestTableMatchesHelpAndCompletion(t *testing.T) {
	for _, c := range commands {
		if c.hidden {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(usageText, "\n  "+c.name+" ") {
				t.Errorf("the help has no line for %s", c.name)
			}
			word, sub, grouped := strings.Cut(c.name, " ") // session open: session, then open
			if !slices.Contains(strings.Fields(completedCommands(t)), word) {
				t.Errorf("the completion script does not offer %s", word)
			}
			if grouped && !strings.Contains(bashCompletion, sub) {
				t.Errorf("the completion script does not offer %s after %s", sub, word)
			}
			if lookup(strings.Fields(c.name)) != &commands[indexOf(c.name)] {
				t.Errorf("lookup(%q) is not its entry", c.name)
			}
		})
	}
	if lookup([]string{"frobnicate"}) != nil || lookup(nil) != nil {
		t.Error("lookup found a command that is not in the table")
	}
}

// completedCommands is the completion script's list of commands.
func completedCommands(t *testing.T) string {
	_, rest, ok := strings.Cut(bashCompletion, `local cmds="`)
	list, _, ok2 := strings.Cut(rest, `"`)
	if !ok || !ok2 {
		t.Fatal("no cmds list in the completion script")
	}
	return list
}

func indexOf(name string) int {
	for i, c := range commands {
		if c.name == name {
			return i
		}
	}
	return -1
}

// TestNoGeneratedStub: coordctl is a face of the SDK; it imports no
// generated gRPC code (tests may, to serve a fake coordinator).
func TestNoGeneratedStub(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range parsed.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); strings.Contains(p, "/api/coordinator/") {
				t.Errorf("%s imports %s: call the SDK (package client) instead", f, p)
			}
		}
	}
}
