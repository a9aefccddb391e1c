// Package docs holds the repository's documentation. Its test keeps the
// repository standing alone: README, docs and code comments may point only at
// files inside the repository, and every such pointer must resolve; and
// README's promises about the tree itself hold (make fuzz: fuzz_test.go).
package docs

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// mdLink is the target of a markdown link (in parentheses after the text).
	mdLink = regexp.MustCompile(`\]\(([^)\s#]+)(?:#[^)]*)?\)`)
	// mdRef is a bare mention of a markdown file (a name ending in .md).
	mdRef = regexp.MustCompile(`(?:\.{1,2}/)*[A-Za-z0-9_./-]*[A-Za-z0-9_-]+\.md\b`)
	// upRef is a relative path that climbs: ../something.
	upRef = regexp.MustCompile(`(?:\.\./)+[A-Za-z0-9_.-]+`)
	// hostPath is an absolute path of one machine's file system.
	hostPath = regexp.MustCompile(`(?:^|[\s"'(=:])(/(?:work|home|Users)/[^\s"'()]*)`)
	// url is removed before looking for file names.
	url = regexp.MustCompile(`[a-z][a-z0-9+.-]*://[^\s)"'>]*`)
)

// problems lists the references in text (found in file rel of the repository
// at root) that point outside the repository or at nothing. prose is set for
// documentation and comments, where a name ending in .md must be a document
// of the repository (scripts name the reports they write, under out/).
func problems(root, rel, text string, prose bool) []string {
	text = url.ReplaceAllString(text, "")
	var out []string
	dir := filepath.Dir(filepath.Join(root, rel))
	inside := func(p string) bool {
		r, err := filepath.Rel(root, p)
		return err == nil && r != ".." && !strings.HasPrefix(r, "../")
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	resolve := func(ref string) (string, bool) {
		for _, base := range []string{dir, root} {
			p := filepath.Clean(filepath.Join(base, ref))
			if inside(p) && exists(p) {
				return p, true
			}
		}
		return "", false
	}
	seen := map[string]bool{}
	report := func(ref, why string) {
		if !seen[ref] {
			seen[ref] = true
			out = append(out, rel+": "+ref+": "+why)
		}
	}
	for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
		if ref := m[1]; !strings.HasPrefix(ref, "mailto:") {
			if _, ok := resolve(ref); !ok {
				report(ref, "link to no file inside the repository")
			}
		}
	}
	if prose {
		for _, ref := range mdRef.FindAllString(text, -1) {
			if strings.HasPrefix(ref, "out/") {
				continue // a report a run writes
			}
			if _, ok := resolve(ref); !ok {
				report(ref, "names a document that is not in the repository")
			}
		}
	}
	for _, ref := range upRef.FindAllString(text, -1) {
		if !inside(filepath.Clean(filepath.Join(dir, ref))) {
			report(ref, "climbs out of the repository")
		}
	}
	for _, m := range hostPath.FindAllStringSubmatch(text, -1) {
		report(m[1], "absolute path of one machine")
	}
	return out
}

// goComments returns the comments of a Go file, one per line.
func goComments(t *testing.T, path string) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	var b strings.Builder
	for _, g := range f.Comments {
		b.WriteString(g.Text())
		b.WriteByte('\n')
	}
	return b.String()
}

// TestNoReferenceOutsideTheRepository reads README.md, every file under docs/
// and the comments of every Go file, and the text of the scripts, makefiles,
// Lua scripts, configuration and deployment files.
func TestNoReferenceOutsideTheRepository(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch d.Name() {
			case ".git", "bin", "out", "node_modules", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		ext := filepath.Ext(name)
		var text string
		prose := true
		switch {
		case ext == ".go":
			text = goComments(t, path)
		case ext == ".md":
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			text = string(b)
		case ext == ".sh" || ext == ".mk" || ext == ".lua" || ext == ".toml" || ext == ".yml" || ext == ".yaml" ||
			name == "Makefile" || name == "Dockerfile" || rel == filepath.Join(".ci", "run"):
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			text, prose = string(b), false
		default:
			return nil
		}
		checked++
		found = append(found, problems(root, rel, text, prose)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("only %d files checked: is the walk rooted at the repository?", checked)
	}
	for _, p := range found {
		t.Error(p)
	}
}

// The checker itself catches what it is for.
func TestProblemsCatchesOutsideReferences(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	// Built from parts, so that a grep of the repository for references to
	// outside folders finds none in this file either.
	outside := ".." + "/shared/DESIGN.md"
	cases := map[string]bool{
		"the contract is in `" + outside + "`.":               true,
		"see [the design](../" + outside + ")":                true,
		"see DESIGN.md §3":                                    true,
		"state lives in /work/shared/notes.txt":               true,
		"see [invariants](invariants.md) and docs/README.md":  false,
		"see [limits](https://example.com/limits.md)":         false,
		"protocol: docs/purchase-path.md, config ../conf/":    false,
		"[missing](nothere.md) is a broken link":              true,
		"temporary files go to /tmp/seckill, which is fine":   false,
		"the parent of the repository is ../../.. everything": true,
	}
	for text, bad := range cases {
		got := problems(root, filepath.Join("docs", "x.md"), text, true)
		if (len(got) > 0) != bad {
			t.Errorf("%q: problems %q, want some: %v", text, got, bad)
		}
	}
}
