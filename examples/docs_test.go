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
	// upPath is a file named by a path that climbs out of the doc's folder
	// (../docs/CONCEPTS.md, ../shared/DESIGN.md), link or not; a folder
	// (kustomize's ../etcd) has no extension.
	upPath = regexp.MustCompile(`(?:\.\./)+[A-Za-z0-9_./-]*\.[A-Za-z]+\b`)
	// docName is a project doc named alone, in upper case (DESIGN.md).
	docName = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])([A-Z][A-Z0-9_]*\.md)\b`)
)

// The user docs (README.md, docs/, deploy/README.md) link only inside the
// repository, to files and headings that exist, and name no internal issue
// numbers. A web address is allowed only on loopback, in a command (other
// schemes are identifiers: spiffe://, dns:///, unix://). A file they cite
// in prose is in the repository too (docs/CONTRIBUTING.md and
// docs/BENCHMARKS.md cited ../shared/DESIGN.md, a contract outside it).
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
			checkCitations(t, f, text)
		})
	}
}

// checkCitations fails for each file that f (whose text is text) names
// without a link but the repository does not hold: a path that climbs out
// of f's folder must name a file of the repository from there, and a doc
// named alone (DESIGN.md) must be beside f, at the root or in docs/.
func checkCitations(t *testing.T, f, text string) {
	t.Helper()
	for _, ref := range upPath.FindAllString(text, -1) {
		full := filepath.Join(repoRoot, filepath.Dir(f), ref)
		rel, err := filepath.Rel(repoRoot, full)
		if _, serr := os.Stat(full); err != nil || strings.HasPrefix(rel, "..") || serr != nil {
			t.Errorf("%s names %s, no file of the repository: the docs cite only what it holds (a design note goes in docs/)", f, ref)
		}
	}
	for _, m := range docName.FindAllStringSubmatch(text, -1) {
		found := false
		for _, dir := range []string{filepath.Dir(f), ".", "docs"} {
			if _, err := os.Stat(filepath.Join(repoRoot, dir, m[1])); err == nil {
				found = true
			}
		}
		if !found {
			t.Errorf("%s names %s, which is not in the repository (beside it, at the root or in docs/)", f, m[1])
		}
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
