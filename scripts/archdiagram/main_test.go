package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// moduleRoot is the checkout's root, two directories above this package.
const moduleRoot = "../.."

// modulePackages lists the module once for every test that needs it.
var modulePackages = sync.OnceValues(func() ([]Package, error) {
	return loadPackages(moduleRoot)
})

func TestSVGIsCurrent(t *testing.T) {
	pkgs, err := modulePackages()
	if err != nil {
		t.Fatal(err)
	}
	want := Layout(pkgs).SVG()
	path := filepath.Join(moduleRoot, "docs", "architecture-packages.svg")
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("docs/architecture-packages.svg is not what the current imports draw: run `make architecture-svg`\nthe imports now:\n%s", edgeList(pkgs))
	}
}

func edgeList(pkgs []Package) string {
	var b strings.Builder
	for _, p := range pkgs {
		b.WriteString(p.Path + ": " + strings.Join(p.Imports, " ") + "\n")
	}
	return b.String()
}

func TestParseList(t *testing.T) {
	raw := []byte(`{"ImportPath":"example.com/m/b","Imports":["fmt","example.com/m/a","example.com/mother/x"],"Module":{"Path":"example.com/m"}}
{"ImportPath":"example.com/m/a","Imports":["strings"],"Module":{"Path":"example.com/m"}}
{"ImportPath":"example.com/m","Imports":["example.com/m/b"],"Module":{"Path":"example.com/m"}}`)
	got, err := parseList(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := []Package{
		{Path: ".", Imports: []string{"b"}},
		{Path: "a"},
		{Path: "b", Imports: []string{"a"}},
	}
	if !slices.EqualFunc(got, want, func(a, b Package) bool {
		return a.Path == b.Path && slices.Equal(a.Imports, b.Imports)
	}) {
		t.Errorf("parseList = %+v, want %+v", got, want)
	}

	for _, bad := range []string{
		`{"ImportPath":"example.com/m/a","Module":{"Path":"example.com/m"},"Error":{"Err":"no Go files"}}`,
		`{"ImportPath":"example.com/m/a"}`,
		`{"ImportPath":"example.com/other","Module":{"Path":"example.com/m"}}`,
		`{"ImportPath":`,
	} {
		if _, err := parseList([]byte(bad)); err == nil {
			t.Errorf("parseList(%s) gave no error", bad)
		}
	}
}

func TestLayoutRows(t *testing.T) {
	tests := []struct {
		name string
		pkgs []Package
		want string // Drawing.String
	}{
		{
			name: "a chain stands one row per import",
			pkgs: []Package{{Path: "a", Imports: []string{"b"}}, {Path: "b", Imports: []string{"c"}}, {Path: "c"}},
			want: "0: c\n1: b\n2: a\n",
		},
		{
			name: "a package stands above the highest it imports",
			pkgs: []Package{{Path: "top", Imports: []string{"leaf", "mid"}}, {Path: "mid", Imports: []string{"leaf"}}, {Path: "leaf"}},
			want: "0: leaf\n1: mid\n2: top\n",
		},
		{
			name: "isolated packages at the bottom, internal leaves above them, then the other leaves",
			pkgs: []Package{
				{Path: "alone"},
				{Path: "internal/h"},
				{Path: "leaf"},
				{Path: "user", Imports: []string{"internal/h", "leaf"}},
			},
			want: "0: alone\n1: internal/h\n2: leaf\n3: user\n",
		},
		{
			name: "no empty rows",
			pkgs: []Package{{Path: "a", Imports: []string{"b"}}, {Path: "b"}},
			want: "0: b\n1: a\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Layout(tt.pkgs).String(); got != tt.want {
				t.Errorf("rows:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

// TestLayoutGeometry checks what makes the drawing readable on the
// module's own graph: every import points down and passes each row
// between as a point of its own, and no two items in a row overlap.
func TestLayoutGeometry(t *testing.T) {
	pkgs, err := modulePackages()
	if err != nil {
		t.Fatal(err)
	}
	d := Layout(pkgs)
	for _, e := range d.edges {
		from, to := d.items[e.from].row, d.items[e.to].row
		if from <= to {
			t.Errorf("%s imports %s from row %d into row %d: not downwards", pkgs[e.from].Path, pkgs[e.to].Path, from, to)
		}
		if len(e.via) != from-to-1 {
			t.Errorf("%s → %s passes %d rows through %d points", pkgs[e.from].Path, pkgs[e.to].Path, from-to-1, len(e.via))
		}
	}
	for r, row := range d.rows {
		for k := 1; k < len(row); k++ {
			a, b := d.items[row[k-1]], d.items[row[k]]
			if a.x+a.width/2 >= b.x-b.width/2 {
				t.Errorf("row %d: items %d and %d overlap (%.1f+%.1f, %.1f-%.1f)", r, k-1, k, a.x, a.width/2, b.x, b.width/2)
			}
		}
	}
}

func TestIsotonic(t *testing.T) {
	tests := []struct {
		v, w, want []float64
	}{
		{v: []float64{1, 2, 3}, w: []float64{1, 1, 1}, want: []float64{1, 2, 3}},
		{v: []float64{3, 1}, w: []float64{1, 1}, want: []float64{2, 2}},
		{v: []float64{3, 0}, w: []float64{2, 1}, want: []float64{2, 2}},
		{v: []float64{1, 5, 2, 2, 9}, w: []float64{1, 1, 1, 1, 1}, want: []float64{1, 3, 3, 3, 9}},
	}
	for _, tt := range tests {
		if got := isotonic(tt.v, tt.w); !slices.Equal(got, tt.want) {
			t.Errorf("isotonic(%v, %v) = %v, want %v", tt.v, tt.w, got, tt.want)
		}
	}
}
