package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"html"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// The page whose names the test checks.
const architectureDoc = "docs/architecture.md"

// notOurs are the backticked names on the page that look like Go but are
// declared outside the module, or are not Go at all.
var notOurs = map[string]bool{
	"fasthttp.RequestCtx":                       true, // github.com/valyala/fasthttp
	"SetBodyStreamWriter":                       true, // fasthttp.RequestCtx's
	"StreamRequestBody":                         true, // fasthttp.Server's
	"usage.prompt_tokens_details.cached_tokens": true, // a field of vLLM's answer
	"tokenizer.json":                            true, // Hugging Face's tokenizer file
	"BlockStored":                               true, // vLLM's event names (events.KindBlockStored, ...)
	"BlockRemoved":                              true,
	"AllBlocksCleared":                          true,
}

// TestArchitectureNames checks that every file docs/architecture.md names
// (a backticked path ending in .go, or a backticked directory path)
// exists, and that every backticked Go name resolves to a declaration of
// the module: `Router.handle`, `health.Target.Dispatch`, `Booking`,
// `kvindex.Message.StartOver`. A dotted name resolves when its type (or,
// first, its package) declares the method or field; a single name when
// any package declares it at top level, or as a method or field. Names
// all lower case (`attempt`, `model`, `serve`) are left alone: they are
// as often a JSON field or a command as a Go name.
func TestArchitectureNames(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(moduleRoot, architectureDoc))
	if err != nil {
		t.Fatal(err)
	}
	decls, err := moduleDecls()
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, s := range codeSpans(string(doc)) {
		name := strings.TrimSuffix(s.text, "()")
		switch {
		case notOurs[name]:
		case strings.HasSuffix(name, ".go") || dirPath.MatchString(name):
			checked++
			if _, err := os.Stat(filepath.Join(moduleRoot, filepath.FromSlash(name))); err != nil {
				t.Errorf("line %d: `%s`: no such file or directory", s.line, s.text)
			}
		case goName.MatchString(name) && (strings.Contains(name, ".") || mixedCase.MatchString(name)):
			checked++
			if !decls.resolve(name) {
				t.Errorf("line %d: `%s`: no such declaration in the module", s.line, s.text)
			}
		}
	}
	if checked < 100 {
		t.Errorf("only %d names checked: the page's code spans were not found", checked)
	}
}

// The drawings of the two paths, drawn by hand: each marks a file name
// with class "f" and a Go name with class "n".
var pathDrawings = []string{"docs/architecture-request.svg", "docs/architecture-events.svg"}

var drawnName = regexp.MustCompile(`class="([fn])">([^<]+)<`)

// TestDrawingNames checks the hand-drawn path drawings as
// TestArchitectureNames checks the page: every file they name exists,
// and every Go name resolves to a declaration of the module.
func TestDrawingNames(t *testing.T) {
	decls, err := moduleDecls()
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range pathDrawings {
		svg, err := os.ReadFile(filepath.Join(moduleRoot, path))
		if err != nil {
			t.Fatal(err)
		}
		marks := drawnName.FindAllStringSubmatch(string(svg), -1)
		if len(marks) < 40 {
			t.Errorf("%s: only %d names marked: the drawing's classes were not found", path, len(marks))
		}
		for _, m := range marks {
			class, name := m[1], html.UnescapeString(m[2])
			switch {
			case notOurs[name]:
			case class == "f" || strings.Contains(name, "/"):
				if _, err := os.Stat(filepath.Join(moduleRoot, filepath.FromSlash(name))); err != nil {
					t.Errorf("%s: %s: no such file or directory", path, name)
				}
			case !goName.MatchString(name) || !decls.resolve(name):
				t.Errorf("%s: %s: no such declaration in the module", path, name)
			}
		}
	}
}

var (
	dirPath   = regexp.MustCompile(`^[a-z][a-z0-9]*(/[a-z][a-z0-9]*)+$`)
	goName    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)
	mixedCase = regexp.MustCompile(`^([a-z]+[A-Z]|[A-Z][A-Za-z0-9]*[a-z])[A-Za-z0-9]*$`)
)

type span struct {
	text string
	line int
}

// codeSpans finds the page's inline code (`...`), outside fenced blocks.
func codeSpans(doc string) []span {
	var out []span
	fenced := false
	for n, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		parts := strings.Split(line, "`")
		for k := 1; k < len(parts); k += 2 {
			if k+1 < len(parts) { // an unclosed backtick opens no span
				out = append(out, span{parts[k], n + 1})
			}
		}
	}
	return out
}

// decls is every name the module declares: by package name, its top
// level names ("Router", "ParseRequest") and its types' methods and
// fields ("Router.handle").
type decls struct {
	byPkg   map[string]map[string]bool
	members map[string]bool // every method and field name, of any type
}

func (d decls) resolve(name string) bool {
	parts := strings.Split(name, ".")
	if len(parts) > 1 {
		if pkg, ok := d.byPkg[parts[0]]; ok && resolveIn(pkg, parts[1:]) {
			return true
		}
	}
	for _, pkg := range d.byPkg {
		if resolveIn(pkg, parts) {
			return true
		}
	}
	return len(parts) == 1 && d.members[name]
}

func resolveIn(pkg map[string]bool, parts []string) bool {
	return len(parts) <= 2 && pkg[strings.Join(parts, ".")]
}

// docPackage is what the doc checks read of `go list`.
type docPackage struct {
	ImportPath, Dir, Name                        string
	GoFiles, CgoFiles, TestGoFiles, XTestGoFiles []string
	IgnoredGoFiles                               []string
	Imports, TestImports, XTestImports           []string
	Module                                       *struct{ Path string }
}

var listDocPackages = sync.OnceValues(func() ([]docPackage, error) {
	cmd := exec.Command("go", "list", "-json=ImportPath,Dir,Name,GoFiles,CgoFiles,TestGoFiles,XTestGoFiles,IgnoredGoFiles,Imports,TestImports,XTestImports,Module", "./...")
	cmd.Dir = moduleRoot
	cmd.Env = append(os.Environ(), goListEnv...)
	raw, err := cmd.Output()
	if err != nil {
		return nil, err
	}
	var pkgs []docPackage
	dec := json.NewDecoder(bytes.NewReader(raw))
	for {
		var p docPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs, nil
		} else if err != nil {
			return nil, err
		}
		pkgs = append(pkgs, p)
	}
})

// moduleDecls parses every Go file of the module, tests and files other
// builds select included, for its declarations: one file at a time per
// CPU, each into names of its own, merged once all are read. The tests
// share one parse.
var moduleDecls = sync.OnceValues(parseModuleDecls)

func parseModuleDecls() (decls, error) {
	pkgs, err := listDocPackages()
	if err != nil {
		return decls{}, err
	}
	type parsed struct {
		pkg            string
		names, members map[string]bool
		err            error
	}
	var files [][2]string // package directory, file
	for _, p := range pkgs {
		for _, f := range slices.Concat(p.GoFiles, p.CgoFiles, p.TestGoFiles, p.XTestGoFiles, p.IgnoredGoFiles) {
			files = append(files, [2]string{p.Dir, f})
		}
	}
	out := make([]parsed, len(files))
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			fset := token.NewFileSet()
			for k := int(next.Add(1) - 1); k < len(files); k = int(next.Add(1) - 1) {
				path := filepath.Join(files[k][0], files[k][1])
				file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
				if err != nil {
					out[k].err = err
					continue
				}
				out[k] = parsed{pkg: strings.TrimSuffix(file.Name.Name, "_test"), names: map[string]bool{}, members: map[string]bool{}}
				addDecls(file, out[k].names, out[k].members)
			}
		})
	}
	wg.Wait()
	d := decls{byPkg: map[string]map[string]bool{}, members: map[string]bool{}}
	for _, p := range out {
		if p.err != nil {
			return decls{}, p.err
		}
		if d.byPkg[p.pkg] == nil {
			d.byPkg[p.pkg] = map[string]bool{}
		}
		maps.Copy(d.byPkg[p.pkg], p.names)
		maps.Copy(d.members, p.members)
	}
	return d, nil
}

func addDecls(file *ast.File, names, members map[string]bool) {
	member := func(typ, name string) {
		names[typ+"."+name] = true
		members[name] = true
	}
	for _, decl := range file.Decls {
		switch decl := decl.(type) {
		case *ast.FuncDecl:
			if decl.Recv == nil || len(decl.Recv.List) == 0 {
				names[decl.Name.Name] = true
				continue
			}
			member(receiverType(decl.Recv.List[0].Type), decl.Name.Name)
		case *ast.GenDecl:
			for _, spec := range decl.Specs {
				switch spec := spec.(type) {
				case *ast.TypeSpec:
					typ := spec.Name.Name
					names[typ] = true
					switch t := spec.Type.(type) {
					case *ast.StructType:
						for _, f := range t.Fields.List {
							if len(f.Names) == 0 { // embedded: named by its type
								member(typ, receiverType(f.Type))
							}
							for _, n := range f.Names {
								member(typ, n.Name)
							}
						}
					case *ast.InterfaceType:
						for _, m := range t.Methods.List {
							for _, n := range m.Names {
								member(typ, n.Name)
							}
						}
					}
				case *ast.ValueSpec:
					for _, n := range spec.Names {
						names[n.Name] = true
					}
				}
			}
		}
	}
}

// receiverType names the type of a receiver or an embedded field: T for
// T, *T, T[P], pkg.T.
func receiverType(e ast.Expr) string {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.SelectorExpr:
			return t.Sel.Name
		case *ast.Ident:
			return t.Name
		default:
			return ""
		}
	}
}

// TestArchitecturePackageTable checks the page's package table against
// `go list`: one row per package of the module, no other, and each row's
// imports column names exactly the module's packages it imports (its
// tests' imports, when the row says "tests only").
func TestArchitecturePackageTable(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(moduleRoot, architectureDoc))
	if err != nil {
		t.Fatal(err)
	}
	pkgs, err := listDocPackages()
	if err != nil {
		t.Fatal(err)
	}
	rows := packageTable(string(doc))
	if len(rows) == 0 {
		t.Fatal("no package table (rows `| `pkg` | owns | imports |`) on the page")
	}
	seen := map[string]bool{}
	for _, p := range pkgs {
		path, _ := inModule(p.Module.Path, p.ImportPath)
		seen[path] = true
		row, ok := rows[path]
		if !ok {
			t.Errorf("package %s has no row in the table", path)
			continue
		}
		imports := p.Imports
		if strings.Contains(row, "tests only") {
			imports = slices.Concat(p.TestImports, p.XTestImports)
		}
		var want []string
		for _, imp := range imports {
			if rel, ok := inModule(p.Module.Path, imp); ok && rel != path {
				want = append(want, rel)
			}
		}
		want = uniqueSorted(want)
		var got []string
		for _, s := range codeSpans(row) {
			got = append(got, s.text)
		}
		got = uniqueSorted(got)
		if !slices.Equal(got, want) {
			t.Errorf("package %s: the table says it imports %v; go list says %v", path, got, want)
		}
	}
	for path := range rows {
		if !seen[path] {
			t.Errorf("the table has a row for %s, which go list does not list", path)
		}
	}
}

// packageTable reads the rows of the page's first table whose first
// column is a backticked package path: the path, and the row's last
// column.
func packageTable(doc string) map[string]string {
	rows := map[string]string{}
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(line, "| `") {
			if len(rows) > 0 {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) < 3 {
			continue
		}
		first := strings.TrimSpace(cells[0])
		path := strings.Trim(first, "`")
		if path == first {
			continue
		}
		rows[path] = cells[len(cells)-1]
	}
	return rows
}
