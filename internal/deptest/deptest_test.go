package deptest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A rule forbids packages matching from to depend, directly or through
// other packages of the module, on packages matching to. Paths are
// relative to the module root ("host/store", "plugins/ws").
type rule struct {
	name   string
	from   func(pkg string) bool
	forbid func(pkg, dep string) bool
}

var rules = []rule{
	{
		name:   "host never imports plugins",
		from:   under("host"),
		forbid: func(_, dep string) bool { return within(dep, "plugins") },
	},
	{
		name:   "a plugin never imports host",
		from:   under("plugins"),
		forbid: func(_, dep string) bool { return within(dep, "host") },
	},
	{
		name: "a plugin never imports another plugin",
		from: under("plugins"),
		forbid: func(pkg, dep string) bool {
			return within(dep, "plugins") && pluginName(dep) != pluginName(pkg)
		},
	},
	{
		// wire is the standard library only (TestWireStandardOnly), so a
		// plugin author taking contract gets the protocol's close codes
		// and replay reasons from their one definition at no cost.
		name:   "contract imports nothing of ours but contract and wire",
		from:   under("contract"),
		forbid: func(_, dep string) bool { return !within(dep, "contract") && !within(dep, "wire") },
	},
	{
		// The table's records are reached only through its exported
		// API, and only by the gateways that bind viewers and the wiring:
		// a PTY router, a transport link or a supervisor that could reach
		// a session would be a second teardown path.
		name: "only the gateways and the wiring reach the session table",
		from: func(pkg string) bool {
			return within(pkg, "host") && pkg != "host" && !within(pkg, "host/internal/rpc") &&
				!within(pkg, "host/internal/acpgw") && !within(pkg, "host/internal/session")
		},
		forbid: func(_, dep string) bool { return within(dep, "host/internal/session") },
	},
	{
		name: "the session table knows nothing of transports, PTYs or plugins",
		from: under("host/internal/session"),
		forbid: func(_, dep string) bool {
			for _, d := range []string{"host/internal/rpc", "host/internal/acpgw", "host/internal/acpagent", "host/internal/link", "host/internal/ptyroute", "host/internal/supervise", "host/internal/access", "plugins", "cmd"} {
				if within(dep, d) {
					return true
				}
			}
			return false
		},
	},
	{
		// host/internal/cluster wires its parts into a node; a part that
		// reached back for the node would be a circle.
		name:   "the cluster's parts never import the node that wires them",
		from:   func(pkg string) bool { return within(pkg, "host/internal/cluster") && pkg != "host/internal/cluster" },
		forbid: func(_, dep string) bool { return dep == "host/internal/cluster" },
	},
	{
		// bus (the JetStream helpers) and embedded (the in-process
		// server and the bus's credentials) are what the other parts
		// stand on: they take nothing of tether's.
		name: "the cluster's bus and embedded server import nothing of ours",
		from: func(pkg string) bool {
			return within(pkg, "host/internal/cluster/bus") || within(pkg, "host/internal/cluster/embedded")
		},
		forbid: func(pkg, dep string) bool { return !within(dep, pkg) },
	},
	{
		name:   "only tests start the cluster's test servers",
		from:   func(pkg string) bool { return !within(pkg, "host/internal/cluster/clustertest") },
		forbid: func(_, dep string) bool { return within(dep, "host/internal/cluster/clustertest") },
	},
	{
		name:   "wire imports nothing of ours",
		from:   under("wire"),
		forbid: func(_, dep string) bool { return !within(dep, "wire") },
	},
	{
		name: "client never imports host, plugins, contract or testing",
		from: under("client"),
		forbid: func(_, dep string) bool {
			return within(dep, "host") || within(dep, "plugins") || within(dep, "contract") || within(dep, "testing")
		},
	},
	{
		name:   "non-test code never imports testing",
		from:   func(pkg string) bool { return !within(pkg, "testing") },
		forbid: func(_, dep string) bool { return within(dep, "testing") },
	},
}

// within reports whether pkg is dir or a package below it.
func within(pkg, dir string) bool {
	return pkg == dir || strings.HasPrefix(pkg, dir+"/")
}

func under(dir string) func(string) bool {
	return func(pkg string) bool { return within(pkg, dir) }
}

// pluginName returns X for "plugins/X/...", and "" for "plugins".
func pluginName(pkg string) string {
	rest, _ := strings.CutPrefix(pkg, "plugins/")
	name, _, _ := strings.Cut(rest, "/")
	if pkg == "plugins" {
		return ""
	}
	return name
}

// broken returns the names of the rules that forbid pkg to depend on dep.
func broken(pkg, dep string) []string {
	var names []string
	for _, r := range rules {
		if r.from(pkg) && r.forbid(pkg, dep) {
			names = append(names, r.name)
		}
	}
	return names
}

func TestRules(t *testing.T) {
	tests := []struct {
		pkg, dep string
		ok       bool
	}{
		{"host", "contract", true},
		{"host/store", "contract/proto/tetherv1", true},
		{"host/store", "host/agent", true},
		{"host", "plugins/ws", false},
		{"host/supervisor", "plugins/pty/ring", false},
		{"host", "testing/transporttest", false},
		{"plugins/ws", "contract", true},
		{"plugins/ws", "plugins/ws/frame", true},
		{"plugins/ws/frame", "plugins/ws", true},
		{"plugins/ws", "plugins/pty", false},
		{"plugins/wsx", "plugins/ws", false},
		{"plugins/ws", "plugins", false},
		{"plugins/pty", "host", false},
		{"plugins/pty", "host/store", false},
		{"plugins/pty", "testing/backendtest", false},
		{"contract", "contract/proto/tetherv1", true},
		{"contract", "host", false},
		{"contract/proto/tetherv1", "plugins/ws", false},
		{"contract", "testing/transporttest", false},
		{"contract", "cmd/tether", false},
		{"cmd/tether", "host", true},
		{"cmd/tether", "plugins/ws", true},
		{"cmd/tether", "plugins/pty", true},
		{"cmd/tether", "testing/e2e", false},
		{"testing/transporttest", "contract", true},
		{"testing/transporttest", "testing/fake", true},
		{"testing/e2e", "host", true},
		{"testingx", "testing", false},
		{"internal/deptest", "testing/transporttest", false},
		{"contract", "wire", true},
		{"contract/transportkit", "wire", true},
		{"contract", "client", false},
		{"host", "host/internal/session", true},
		{"host/internal/rpc", "host/internal/session", true},
		{"host/internal/acpgw", "host/internal/session", true},
		{"host/internal/acpagent", "host/internal/session", false},
		{"host/internal/ptyroute", "host/internal/session", false},
		{"host/internal/supervise", "host/internal/session", false},
		{"host/internal/link", "host/internal/session", false},
		{"host/internal/session", "host/store", true},
		{"host/internal/session", "host/internal/link", false},
		{"host/internal/session", "host/internal/rpc", false},
		{"host/internal/session", "host/internal/ownership", true},
		{"host/internal/cluster", "host/internal/ownership", true},
		{"host/internal/cluster", "host/internal/session", false},
		{"host/internal/cluster", "host/internal/cluster/embedded", true},
		{"host/internal/cluster/jsstore", "host/internal/cluster/bus", true},
		{"host/internal/cluster/jsstore", "host/internal/cluster", false},
		{"host/internal/cluster/relay", "host/internal/cluster", false},
		{"host/internal/cluster/bus", "host/internal/ownership", false},
		{"host/internal/cluster/embedded", "host/internal/cluster/bus", false},
		{"host/internal/cluster/embedded", "wire", false},
		{"host/internal/cluster", "host/internal/cluster/clustertest", false},
		{"host/internal/cluster/clustertest", "host/internal/cluster/embedded", true},
		{"host/internal/ownership", "host/internal/session", false},
		{"wire", "contract", false},
		{"wire", "client", false},
		{"wire", "wire/internal/x", true},
		{"client", "wire", true},
		{"client", "host", false},
		{"client", "host/store", false},
		{"client", "plugins/ws", false},
		{"client", "contract", false},
		{"client", "testing/wsclient", false},
		{"cmd/tether", "client", true},
		{"testing/wsclient", "client", true},
		{"testing/transporttest", "wire", true},
	}
	for _, tt := range tests {
		t.Run(tt.pkg+"->"+tt.dep, func(t *testing.T) {
			names := broken(tt.pkg, tt.dep)
			if got := len(names) == 0; got != tt.ok {
				t.Errorf("%s -> %s: allowed = %v (broken rules %q), want %v", tt.pkg, tt.dep, got, names, tt.ok)
			}
		})
	}
}

// goPackage is the part of `go list -json` output the test reads.
type goPackage struct {
	ImportPath string
	Imports    []string
	Standard   bool
	GoFiles    []string
	Error      *struct{ Err string }
}

func TestImports(t *testing.T) {
	root, module := moduleRoot(t)
	pkgs := listDeps(t, root)

	// The module's packages, by path relative to the module root.
	rel := func(importPath string) (string, bool) {
		if importPath == module {
			return ".", true
		}
		return strings.CutPrefix(importPath, module+"/")
	}
	graph := make(map[string][]string) // module-relative imports of module packages
	for _, p := range pkgs {
		pkg, ok := rel(p.ImportPath)
		if !ok || p.Standard {
			continue
		}
		if p.Error != nil {
			if len(p.GoFiles) == 0 {
				// Imported but not written yet: it imports nothing, and
				// its importers' edges are still checked.
				t.Logf("go list: %s: %s", p.ImportPath, p.Error.Err)
			} else {
				// Its imports may be incomplete.
				t.Errorf("go list: %s: %s", p.ImportPath, p.Error.Err)
			}
		}
		graph[pkg] = []string{}
		for _, imp := range p.Imports {
			if dep, ok := rel(imp); ok {
				graph[pkg] = append(graph[pkg], dep)
			}
		}
	}

	// The test must not pass because it saw nothing.
	if _, ok := graph["contract"]; !ok {
		t.Fatalf("go list -deps ./... in %s did not list %s/contract; listed %d module packages", root, module, len(graph))
	}
	if !slices.Contains(graph["contract"], "contract/proto/tetherv1") {
		t.Fatalf("go list: %s/contract does not import contract/proto/tetherv1: the import graph was not read", module)
	}

	pkgNames := make([]string, 0, len(graph))
	for pkg := range graph {
		pkgNames = append(pkgNames, pkg)
	}
	slices.Sort(pkgNames)
	for _, pkg := range pkgNames {
		// Walk everything pkg depends on within the module, remembering
		// how each dependency was reached.
		via := map[string]string{pkg: ""}
		queue := []string{pkg}
		for len(queue) > 0 {
			cur := queue[0]
			queue = queue[1:]
			for _, dep := range graph[cur] {
				if _, seen := via[dep]; seen {
					continue
				}
				via[dep] = cur
				queue = append(queue, dep)
				for _, name := range broken(pkg, dep) {
					t.Errorf("%s: %s imports %s", name, pkg, chain(via, dep))
				}
			}
		}
	}
}

// TestWireStandardOnly checks that wire and everything it depends on is
// the standard library: third parties can take it without a dependency.
// (Its subpackages are taken on their own: wire/vtquery parses escape
// sequences with github.com/charmbracelet/x/ansi.)
func TestWireStandardOnly(t *testing.T) {
	root, module := moduleRoot(t)
	out := goCmd(t, root, "list", "-deps", "-json=ImportPath,Standard", "./wire")
	dec := json.NewDecoder(bytes.NewReader(out))
	seenWire := false
	for {
		var p goPackage
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		switch {
		case p.ImportPath == module+"/wire":
			seenWire = true
		case strings.HasPrefix(p.ImportPath, module+"/wire/"), p.Standard:
		default:
			t.Errorf("wire depends on %s, which is not the standard library", p.ImportPath)
		}
	}
	if !seenWire {
		t.Fatalf("go list -deps ./wire did not list %s/wire", module)
	}
}

// chain renders how dep was reached: "a -> b -> dep".
func chain(via map[string]string, dep string) string {
	path := []string{dep}
	for p := via[dep]; p != ""; p = via[p] {
		path = append(path, p)
	}
	slices.Reverse(path)
	return strings.Join(path[1:], " -> ")
}

// moduleRoot returns the directory holding go.mod and the module path.
func moduleRoot(t testing.TB) (dir, module string) {
	t.Helper()
	gomod := strings.TrimSpace(string(goCmd(t, "", "env", "GOMOD")))
	if gomod == "" || gomod == "/dev/null" || gomod == "NUL" {
		t.Fatalf("go env GOMOD = %q: not inside a module", gomod)
	}
	dir = filepath.Dir(gomod)
	module = strings.TrimSpace(string(goCmd(t, dir, "list", "-m")))
	if module == "" {
		t.Fatalf("go list -m in %s printed nothing", dir)
	}
	return dir, module
}

// listDeps runs `go list -deps` over the module: the non-test import
// graph of every package in it.
func listDeps(t testing.TB, root string) []goPackage {
	t.Helper()
	out := goCmd(t, root, "list", "-e", "-deps", "-json=ImportPath,Imports,Standard,GoFiles,Error", "./...")
	var pkgs []goPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p goPackage
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func goCmd(t testing.TB, dir string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out
}
