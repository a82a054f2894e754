package rpc

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tether-agent/tether/wire"
)

// wireConsts returns the string constants of package wire whose names
// start with prefix, by name, read from its source (so that a method
// added to wire and not to the gateway, or the other way round, is
// noticed).
func wireConsts(tb testing.TB, prefix string) map[string]string {
	tb.Helper()
	dir := filepath.Join("..", "..", "..", "wire")
	entries, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatalf("read %s: %v", dir, err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
		if err != nil {
			tb.Fatalf("parse %s: %v", e.Name(), err)
		}
		files = append(files, f)
	}
	out := make(map[string]string)
	for _, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if !strings.HasPrefix(name.Name, prefix) || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						tb.Fatalf("wire.%s: %v", name.Name, err)
					}
					out[name.Name] = v
				}
			}
		}
	}
	if len(out) == 0 {
		tb.Fatalf("no %s* constants found in %s", prefix, dir)
	}
	return out
}

// TestMethodsAreWire: the gateway serves exactly the methods package wire
// names (wire.Method*, less wire.MethodEvent, the server's notification).
func TestMethodsAreWire(t *testing.T) {
	var want []string
	for name, v := range wireConsts(t, "Method") {
		if v != wire.MethodEvent {
			want = append(want, v)
		} else if name != "MethodEvent" {
			t.Errorf("wire.%s = %q, the notification's method", name, v)
		}
	}
	got := make([]string, 0, len(methods))
	for name := range methods {
		got = append(got, name)
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("method table has %q, want the wire.Method* set %q", got, want)
	}
}
