package examples_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	webURL     = regexp.MustCompile(`\bhttps?://[^\s)'"\x60]+`)
	issueRef   = regexp.MustCompile(`(?i)\bissues?\s+#?\d+`)
	loopbackRe = regexp.MustCompile(`^[a-z]+://(127\.0\.0\.1|localhost|\[::1\])[:/]`)
	// An address inside a cluster (a Kubernetes Service or pod name such as
	// etcd-0.etcd, or *.svc, *.cluster.local), with its port: an endpoint in
	// a command, not a page outside the repository.
	inClusterRe = regexp.MustCompile(`^[a-z]+://([a-z0-9-]+\.)*([a-z0-9-]+|etcd|svc|cluster\.local):\d+(/|,|$)`)
)

// The user docs (README.md, docs/, deploy/README.md) link only inside the
// repository, to files and headings that exist, and name no internal issue
// numbers. A web address is allowed only on loopback, in a command (other
// schemes are identifiers: spiffe://, dns:///, unix://).
func TestDocsLinks(t *testing.T) {
	files := []string{"README.md", filepath.Join("deploy", "README.md")}
	err := filepath.WalkDir(filepath.Join(repoRoot, "docs"), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, _ := filepath.Rel(repoRoot, path)
			files = append(files, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(repoRoot, f))
			if err != nil {
				t.Fatal(err)
			}
			text := string(b)
			for _, u := range webURL.FindAllString(text, -1) {
				if !loopbackRe.MatchString(u) && !inClusterRe.MatchString(u) {
					t.Errorf("%s names %s: the docs link nothing outside the repository", f, u)
				}
			}
			for _, m := range issueRef.FindAllString(text, -1) {
				t.Errorf("%s names %q: no internal issue numbers in the docs", f, m)
			}
			for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
				checkLink(t, f, text, m[1])
			}
		})
	}
}

// checkLink fails unless target, a link of file f (whose text is text),
// names an existing file of the repository and, after '#', a heading of it.
func checkLink(t *testing.T, f, text, target string) {
	t.Helper()
	path, frag, _ := strings.Cut(target, "#")
	targetText := text
	if path != "" {
		full := filepath.Join(repoRoot, filepath.Dir(f), path)
		if rel, err := filepath.Rel(repoRoot, full); err != nil || strings.HasPrefix(rel, "..") {
			t.Errorf("%s links %s, outside the repository", f, target)
			return
		}
		b, err := os.ReadFile(full)
		if err != nil {
			if st, serr := os.Stat(full); serr == nil && st.IsDir() && frag == "" {
				return
			}
			t.Errorf("%s links %s: %v", f, target, err)
			return
		}
		targetText = string(b)
	}
	if frag != "" && strings.HasSuffix(path, ".md") || frag != "" && path == "" {
		if !headingAnchors(targetText)[frag] {
			t.Errorf("%s links %s: no heading has the anchor #%s", f, target, frag)
		}
	}
}

// headingAnchors are the anchors GitHub gives the headings of a Markdown
// text: lower case, spaces as '-', punctuation but '-' and '_' dropped.
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	fenced := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "```") {
			fenced = !fenced
		}
		if fenced || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
				b.WriteRune(r)
			}
		}
		anchors[b.String()] = true
	}
	return anchors
}
