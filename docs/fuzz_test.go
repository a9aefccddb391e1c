package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// fuzzTarget matches an entry of worker/worker.mk's FUZZ_TARGETS list, "./pkg:FuzzName".
var fuzzTarget = regexp.MustCompile(`(\./[\w/.-]+:Fuzz\w+)`)

// README promises that `make fuzz` runs every fuzz target: the make list and
// the Fuzz functions of the tree must be the same set.
func TestMakeFuzzRunsEveryFuzzTarget(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile(filepath.Join(root, "worker", "worker.mk"))
	if err != nil {
		t.Fatal(err)
	}
	_, list, ok := strings.Cut(string(mk), "FUZZ_TARGETS :=")
	if !ok {
		t.Fatal("worker/worker.mk has no FUZZ_TARGETS")
	}
	list, _, _ = strings.Cut(list, "\n\n")
	listed := fuzzTarget.FindAllString(list, -1)

	var found []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "bin", "out", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir, _ := filepath.Rel(root, filepath.Dir(path))
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Fuzz") && takesF(fn) {
				found = append(found, "./"+filepath.ToSlash(dir)+":"+fn.Name.Name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		t.Fatal("no fuzz target found in the tree")
	}
	slices.Sort(listed)
	slices.Sort(found)
	for _, f := range found {
		if !slices.Contains(listed, f) {
			t.Errorf("%s is not in worker/worker.mk FUZZ_TARGETS", f)
		}
	}
	for _, l := range listed {
		if !slices.Contains(found, l) {
			t.Errorf("FUZZ_TARGETS names %s, which does not exist", l)
		}
	}
}

// takesF reports a func(f *testing.F).
func takesF(fn *ast.FuncDecl) bool {
	ps := fn.Type.Params.List
	if len(ps) != 1 {
		return false
	}
	star, ok := ps[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "F"
}
