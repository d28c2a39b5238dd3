// Command archdiagram draws the import graph of the module's packages as
// an SVG: one box per package, in rows by how far the package stands
// above the leaves, and one arrow per import from one of the module's
// packages to another. It reads the graph from `go list`, so the drawing
// docs/architecture.md shows is the code's own; `make architecture-svg`
// writes it, and TestSVGIsCurrent fails once the checked-in drawing no
// longer matches the imports. Only the packages' own imports count, not
// their tests'.
//
// The package's tests also check docs/architecture.md and its two
// hand-drawn path drawings against the code: every file they name exists,
// every Go name resolves to a declaration, and the page's package table
// lists exactly the module's packages with their imports.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

func main() {
	out := flag.String("o", "docs/architecture-packages.svg", "the SVG file to write")
	dir := flag.String("C", ".", "a directory inside the module whose packages are drawn")
	flag.Parse()
	if err := run(*dir, *out); err != nil {
		fmt.Fprintln(os.Stderr, "archdiagram:", err)
		os.Exit(1)
	}
}

func run(dir, out string) error {
	pkgs, err := loadPackages(dir)
	if err != nil {
		return err
	}
	svg := Layout(pkgs).SVG()
	if err := os.WriteFile(out, svg, 0o644); err != nil {
		return fmt.Errorf("writing the drawing: %w", err)
	}
	return nil
}

// Package is what the drawing needs of one package: its import path
// inside the module ("router", "kvindex/events") and the module's packages
// it imports, in the same form.
type Package struct {
	Path    string
	Imports []string
}

// listed is the part of `go list -json` the generator reads.
type listed struct {
	ImportPath string
	Imports    []string
	Module     *struct{ Path string }
	Error      *struct{ Err string }
}

// goListEnv fixes what could make `go list` answer differently from one
// machine to the next: the platform and cgo (files chosen by build
// constraints can import other packages), build tags a caller's GOFLAGS
// might carry, a go.work around the checkout, and the network (the module
// cache the build already filled is all it reads).
var goListEnv = []string{
	"GOOS=linux", "GOARCH=amd64", "CGO_ENABLED=1",
	"GOFLAGS=-mod=readonly", "GOWORK=off", "GOPROXY=off",
}

// loadPackages runs `go list` in dir for every package of its module.
func loadPackages(dir string) ([]Package, error) {
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,Module,Error", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), goListEnv...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list in %s: %w: %s", dir, err, strings.TrimSpace(stderr.String()))
	}
	return parseList(raw)
}

// parseList reads the stream of JSON objects `go list -json` writes and
// keeps, of each package's imports, those inside its module.
func parseList(raw []byte) ([]Package, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	var pkgs []Package
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("reading go list's output: %w", err)
		}
		if p.Error != nil {
			return nil, fmt.Errorf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		if p.Module == nil {
			return nil, fmt.Errorf("go list: %s belongs to no module", p.ImportPath)
		}
		mod := p.Module.Path
		path, ok := inModule(mod, p.ImportPath)
		if !ok {
			return nil, fmt.Errorf("go list: %s is outside module %s", p.ImportPath, mod)
		}
		pkg := Package{Path: path}
		for _, imp := range p.Imports {
			if rel, ok := inModule(mod, imp); ok {
				pkg.Imports = append(pkg.Imports, rel)
			}
		}
		slices.Sort(pkg.Imports)
		pkgs = append(pkgs, pkg)
	}
	slices.SortFunc(pkgs, func(a, b Package) int { return strings.Compare(a.Path, b.Path) })
	return pkgs, nil
}

// inModule gives an import path relative to the module's ("." for the
// module's root package), and whether it is inside the module at all.
func inModule(mod, path string) (string, bool) {
	if path == mod {
		return ".", true
	}
	rel, ok := strings.CutPrefix(path, mod+"/")
	return filepath.ToSlash(rel), ok
}
