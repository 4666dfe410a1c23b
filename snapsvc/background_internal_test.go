package snapsvc

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// Every goroutine of the package either is the background's (background.go,
// which Close waits for) or is scoped: it ends with its owner, which says so
// in a "scoped:" comment just above. A goroutine that outlived its
// call with no tracker (a flight entered as its call's time ran out) was
// left running past Close; this keeps the next one from being written.
func TestEveryGoroutineIsTrackedOrScoped(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") || name == "background.go" {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		marked := map[int]bool{}
		for _, cg := range f.Comments {
			// The marker may open a comment of several lines that ends
			// just above the go statement.
			if strings.Contains(cg.Text(), "scoped:") {
				marked[fset.Position(cg.End()).Line+1] = true
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if g, ok := n.(*ast.GoStmt); ok {
				if line := fset.Position(g.Pos()).Line; !marked[line] {
					t.Errorf("%s:%d: a goroutine neither run by the background (background.go) nor marked scoped", name, line)
				}
			}
			return true
		})
	}
}
