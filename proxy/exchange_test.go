package proxy

import (
	"bufio"
	"bytes"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestNoExchangeFieldIsWrittenInMoreThanTwoFiles: each field of exchange
// is written (assigned, incremented, or its address taken, through any
// selector chain: ex.rec.Timing.In = ... writes rec) in at most two of the
// package's files, so that what the exchange holds is decided in one or
// two places and its stages hand the rest on as values. It type-checks the
// package from the go command's export data.
func TestNoExchangeFieldIsWrittenInMoreThanTwoFiles(t *testing.T) {
	out, err := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}} {{.Export}}", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	exports := map[string]string{}
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		path, file, _ := strings.Cut(sc.Text(), " ")
		exports[path] = file
	}
	fset := token.NewFileSet()
	ents, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, e := range ents {
		if n := e.Name(); strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			f, err := parser.ParseFile(fset, n, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
	}
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		return os.Open(exports[path])
	})}
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}}
	if _, err := conf.Check("github.com/tollgate-llm/tollgate/proxy", fset, files, info); err != nil {
		t.Fatal(err)
	}
	// field returns the exchange field at the root of a selector chain.
	field := func(e ast.Expr) string {
		for {
			switch x := e.(type) {
			case *ast.SelectorExpr:
				if tv, ok := info.Types[x.X]; ok && strings.HasSuffix(tv.Type.String(), "proxy.exchange") {
					return x.Sel.Name
				}
				e = x.X
			case *ast.IndexExpr:
				e = x.X
			case *ast.ParenExpr:
				e = x.X
			case *ast.StarExpr:
				e = x.X
			default:
				return ""
			}
		}
	}
	writers := map[string][]string{}
	for _, f := range files {
		name := fset.Position(f.Pos()).Filename
		mark := func(e ast.Expr) {
			if fld := field(e); fld != "" && !slices.Contains(writers[fld], name) {
				writers[fld] = append(writers[fld], name)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.AssignStmt:
				if x.Tok != token.DEFINE {
					for _, l := range x.Lhs {
						mark(l)
					}
				}
			case *ast.IncDecStmt:
				mark(x.X)
			case *ast.UnaryExpr:
				if x.Op == token.AND {
					mark(x.X)
				}
			}
			return true
		})
	}
	if len(writers) == 0 {
		t.Fatal("no write of an exchange field found: the check is broken")
	}
	for fld, fs := range writers {
		if len(fs) > 2 {
			t.Errorf("exchange.%s is written in %d files: %v", fld, len(fs), fs)
		}
	}
}
