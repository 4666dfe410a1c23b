// Command measure prints the measures of package snapsvc's shape that
// .ci/measure-core reports beside its own: the methods on *call, the walk
// of one Restart's context (the functions it stays in, and their files),
// the places that say how the machine's sharing works, and the
// goroutines that may outlive the call that starts them. It reads the
// repository's sources (go/ast) and two coverage profiles of the root
// module's packages: one test that builds a Client and closes it, one
// that does a Restart in between.
//
//	go run . -repo ../.. -new new.out -restart restart.out
package main

import (
	"bufio"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

const module = "github.com/snapsvc/snapsvc/"

func main() {
	repo := flag.String("repo", ".", "the repository's root")
	newProf := flag.String("new", "", "coverage profile of a Client built and closed")
	restartProf := flag.String("restart", "", "coverage profile of a Client that restarts once")
	verbose := flag.Bool("v", false, "list the stays of the walk")
	flag.Parse()
	fset := token.NewFileSet()
	pkg := parseDir(fset, filepath.Join(*repo, "snapsvc"))

	// Methods on *call, by file.
	callFiles := map[string]int{}
	calls := 0
	for name, f := range pkg {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && recvType(fd) == "*call" {
				calls++
				callFiles[filepath.Base(name)]++
			}
		}
	}
	fmt.Printf("%-52s %d (%d files: %s)\n", "methods on *call:", calls, len(callFiles), keys(callFiles))

	// The walk of one Restart's context.
	if *newProf != "" && *restartProf != "" {
		ran := ranMore(readProfile(*newProf), readProfile(*restartProf))
		stays, files := 0, map[string]bool{}
		for _, dir := range []string{"snapsvc", "internal/snapd", "internal/flock", "retry", "budget", "probe"} {
			for name, f := range parseDir(fset, filepath.Join(*repo, dir)) {
				rel := module + dir + "/" + filepath.Base(name)
				for _, d := range f.Decls {
					fd, ok := d.(*ast.FuncDecl)
					if !ok || fd.Body == nil || !carriesContext(fd) {
						continue
					}
					start, end := fset.Position(fd.Pos()).Line, fset.Position(fd.End()).Line
					if ran(rel, start, end) {
						stays++
						files[dir+"/"+filepath.Base(name)] = true
						if *verbose {
							fmt.Printf("  stay: %s/%s %s%s\n", dir, filepath.Base(name), recvPrefix(fd), fd.Name.Name)
						}
					}
				}
			}
		}
		fmt.Printf("%-52s %d stays in %d files\n", "the walk of one Restart's context:", stays, len(files))
	}

	// Places that say how the machine's sharing works: comment blocks of
	// eight lines or more that speak of the machine (or its lock
	// directory) and of its waits or flights (a watcher, observer,
	// follower, flight).
	places := []string{}
	for name, f := range pkg {
		for _, cg := range f.Comments {
			text := cg.Text()
			lines := strings.Count(text, "\n")
			lower := strings.ToLower(text)
			machine := strings.Contains(lower, "machine") || strings.Contains(lower, "lock directory")
			sharing := strings.Contains(lower, "watcher") || strings.Contains(lower, "observer") || strings.Contains(lower, "follower") || strings.Contains(lower, "flight")
			if lines >= 8 && machine && sharing {
				places = append(places, fmt.Sprintf("%s:%d (%d lines)", filepath.Base(name), fset.Position(cg.Pos()).Line, lines))
			}
		}
	}
	sort.Strings(places)
	fmt.Printf("%-52s %d (%s)\n", "places that say how the machine's sharing works:", len(places), strings.Join(places, ", "))

	// Goroutines that may outlive the call that starts them: every go
	// statement outside background.go (the one tracker) that is not
	// marked "scoped:" (joined by its owner before it ends).
	loose := []string{}
	for name, f := range pkg {
		base := filepath.Base(name)
		if base == "background.go" {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			g, ok := n.(*ast.GoStmt)
			if !ok {
				return true
			}
			line := fset.Position(g.Pos()).Line
			if !scopedAt(f, fset, line) {
				loose = append(loose, fmt.Sprintf("%s:%d", base, line))
			}
			return true
		})
	}
	sort.Strings(loose)
	fmt.Printf("%-52s %d (%s)\n", "goroutines started outside the one tracker:", len(loose), strings.Join(loose, ", "))
}

// parseDir parses the production files of dir.
func parseDir(fset *token.FileSet, dir string) map[string]*ast.File {
	out := map[string]*ast.File{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, e := range entries {
		n := e.Name()
		if !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		path := filepath.Join(dir, n)
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		out[path] = f
	}
	return out
}

// recvType is a method's receiver type ("*call"), "" for a function.
func recvType(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return ""
	}
	return exprString(fd.Recv.List[0].Type)
}

func recvPrefix(fd *ast.FuncDecl) string {
	if r := recvType(fd); r != "" {
		return "(" + r + ")."
	}
	return ""
}

func exprString(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return "*" + exprString(t.X)
	case *ast.Ident:
		return t.Name
	case *ast.SelectorExpr:
		return exprString(t.X) + "." + t.Sel.Name
	case *ast.IndexExpr:
		return exprString(t.X)
	}
	return ""
}

// carriesContext reports whether a function receives the call's context:
// a context.Context parameter, or what holds it, as receiver or
// parameter: a *call, or the state of an operation (*operation; *runner
// before issue 40).
func carriesContext(fd *ast.FuncDecl) bool {
	holders := map[string]bool{"context.Context": true, "*call": true, "*operation": true, "*runner": true}
	if holders[recvType(fd)] {
		return true
	}
	for _, p := range fd.Type.Params.List {
		if holders[exprString(p.Type)] {
			return true
		}
	}
	return false
}

// scopedAt reports whether the go statement on line is marked scoped: a
// comment on it, or a comment of several lines ending on the line above,
// says "scoped:" (the rule background_internal_test.go applies).
func scopedAt(f *ast.File, fset *token.FileSet, line int) bool {
	for _, cg := range f.Comments {
		end := fset.Position(cg.End()).Line
		if (end == line || end == line-1) && strings.Contains(cg.Text(), "scoped:") {
			return true
		}
	}
	return false
}

// block is one line of a coverage profile.
type block struct {
	file               string
	startLine, endLine int
	count              int
}

func readProfile(path string) []block {
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer f.Close()
	var out []block
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "mode:") {
			continue
		}
		// file:startLine.startCol,endLine.endCol numStmts count
		colon := strings.LastIndex(line, ":")
		fields := strings.Fields(line[colon+1:])
		if colon < 0 || len(fields) != 3 {
			continue
		}
		span := strings.Split(fields[0], ",")
		sl, _ := strconv.Atoi(strings.Split(span[0], ".")[0])
		el, _ := strconv.Atoi(strings.Split(span[1], ".")[0])
		n, _ := strconv.Atoi(fields[2])
		out = append(out, block{file: line[:colon], startLine: sl, endLine: el, count: n})
	}
	return out
}

// ranMore returns whether a function of file, between lines start and
// end, has a block that ran more often in after than in before.
func ranMore(before, after []block) func(file string, start, end int) bool {
	type key struct {
		file       string
		start, end int
	}
	b := map[key]int{}
	for _, x := range before {
		b[key{x.file, x.startLine, x.endLine}] += x.count
	}
	more := map[string][]int{}
	for _, x := range after {
		if x.count > b[key{x.file, x.startLine, x.endLine}] {
			more[x.file] = append(more[x.file], x.startLine)
		}
	}
	return func(file string, start, end int) bool {
		for _, l := range more[file] {
			if l >= start && l <= end {
				return true
			}
		}
		return false
	}
}

func keys(m map[string]int) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, " ")
}
