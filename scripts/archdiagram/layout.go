package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
)

// The drawing is a layered one (Sugiyama's method): rows first, then the
// order within each row, then the coordinates. Every import points down,
// and an import that spans several rows passes through each row between
// as a point of its own (a dummy), so that it runs between the boxes
// rather than through them.

// Sizes, in SVG user units (pixels at scale 1).
const (
	fontSize   = 13.0
	charWidth  = 7.9 // a monospace glyph at fontSize, a little generous
	boxPadX    = 10.0
	boxHeight  = 26.0
	rowGap     = 64.0 // between one row's boxes and the next's
	boxSpacing = 22.0 // between two boxes in a row
	passWidth  = 7.0  // between an import passing through a row and its neighbours
	margin     = 24.0
	headHeight = 78.0 // the title and the legend above the top row
)

// item is one box (a package) or one point an import passes through.
type item struct {
	pkg   int // index into Drawing.Pkgs; -1 for a pass-through point
	edge  int // the import a pass-through point belongs to
	row   int
	width float64
	x     float64 // centre
	up    []int   // items in the row above linked to this one
	down  []int   // items in the row below
}

// edge is one import: from the importer down to the imported package,
// through the pass-through points between them, top to bottom.
type edge struct {
	from, to int // package indices
	via      []int
}

// Drawing is the laid-out graph.
type Drawing struct {
	Pkgs  []Package
	items []item // the packages first, in Pkgs's order, then the pass-through points
	edges []edge
	rows  [][]int // item indices, bottom row first, in left-to-right order
}

// Rows, bottom up: packages imported by none and importing none sit in
// the bottom row, out of the way; then the leaves under internal/ (the
// helpers every layer shares); then the other leaves; above them each
// package stands one row above the highest package it imports.
const (
	rowIsolated = iota
	rowInternal
	rowLeaves
)

// Layout places every package and import.
func Layout(pkgs []Package) *Drawing {
	d := &Drawing{Pkgs: pkgs}
	index := make(map[string]int, len(pkgs))
	for i, p := range pkgs {
		index[p.Path] = i
	}
	importedBy := make([]int, len(pkgs))
	for i, p := range pkgs {
		for _, imp := range p.Imports {
			j, ok := index[imp]
			if !ok {
				continue // a package go list did not list (excluded by a pattern)
			}
			d.edges = append(d.edges, edge{from: i, to: j})
			importedBy[j]++
		}
	}
	height := make([]int, len(pkgs))
	for i := range height {
		height[i] = -1
	}
	var heightOf func(int) int
	heightOf = func(i int) int {
		if height[i] >= 0 {
			return height[i]
		}
		h := 0
		for _, imp := range pkgs[i].Imports {
			if j, ok := index[imp]; ok {
				h = max(h, heightOf(j)+1)
			}
		}
		height[i] = h
		return h
	}
	rowOf := make([]int, len(pkgs))
	for i, p := range pkgs {
		switch h := heightOf(i); {
		case h > 0:
			rowOf[i] = rowLeaves + h
		case importedBy[i] == 0:
			rowOf[i] = rowIsolated
		case strings.HasPrefix(p.Path, "internal/"):
			rowOf[i] = rowInternal
		default:
			rowOf[i] = rowLeaves
		}
	}
	rowOf = compactRows(rowOf)

	for i, p := range pkgs {
		d.items = append(d.items, item{pkg: i, edge: -1, row: rowOf[i], width: boxWidth(p.Path)})
	}
	for e := range d.edges {
		ed := &d.edges[e]
		prev := ed.from
		for r := rowOf[ed.from] - 1; r > rowOf[ed.to]; r-- {
			d.items = append(d.items, item{pkg: -1, edge: e, row: r})
			it := len(d.items) - 1
			ed.via = append(ed.via, it)
			d.link(prev, it)
			prev = it
		}
		d.link(prev, ed.to)
	}
	nrows := slices.Max(rowOf) + 1
	d.rows = make([][]int, nrows)
	for i, it := range d.items {
		d.rows[it.row] = append(d.rows[it.row], i)
	}
	d.order()
	d.place()
	return d
}

// compactRows renumbers rows so that none is empty.
func compactRows(rowOf []int) []int {
	used := slices.Clone(rowOf)
	slices.Sort(used)
	used = slices.Compact(used)
	out := make([]int, len(rowOf))
	for i, r := range rowOf {
		out[i], _ = slices.BinarySearch(used, r)
	}
	return out
}

func (d *Drawing) link(upper, lower int) {
	d.items[upper].down = append(d.items[upper].down, lower)
	d.items[lower].up = append(d.items[lower].up, upper)
}

func boxWidth(label string) float64 {
	return float64(len(label))*charWidth + 2*boxPadX
}

// order sorts each row to few crossings: barycentre sweeps, down and up
// in turn, keeping the best order seen. Rows start sorted by path, so
// that a tie keeps a package's siblings together.
func (d *Drawing) order() {
	for _, row := range d.rows {
		slices.SortStableFunc(row, func(a, b int) int { return cmp.Compare(d.sortKey(a), d.sortKey(b)) })
	}
	best := d.cloneRows()
	bestCross := d.crossings()
	for sweep := range 24 {
		pos := d.positions()
		if sweep%2 == 0 {
			for r := len(d.rows) - 2; r >= 0; r-- {
				d.sortRow(r, pos, func(it *item) []int { return it.up })
				pos = d.positions()
			}
		} else {
			for r := 1; r < len(d.rows); r++ {
				d.sortRow(r, pos, func(it *item) []int { return it.down })
				pos = d.positions()
			}
		}
		if c := d.crossings(); c < bestCross {
			best, bestCross = d.cloneRows(), c
		}
	}
	d.rows = best
}

// sortKey orders a row before any sweep: packages by path, a
// pass-through point by the path of the package its import leaves.
func (d *Drawing) sortKey(i int) string {
	it := d.items[i]
	if it.pkg >= 0 {
		return d.Pkgs[it.pkg].Path
	}
	e := d.edges[it.edge]
	return d.Pkgs[e.from].Path + "\x00" + d.Pkgs[e.to].Path
}

// sortRow sorts row r by the mean position of each item's neighbours in
// the adjacent row; an item with none keeps its place.
func (d *Drawing) sortRow(r int, pos []float64, neighbours func(*item) []int) {
	row := d.rows[r]
	key := make(map[int]float64, len(row))
	for _, i := range row {
		ns := neighbours(&d.items[i])
		if len(ns) == 0 {
			key[i] = pos[i]
			continue
		}
		sum := 0.0
		for _, n := range ns {
			sum += pos[n]
		}
		key[i] = sum / float64(len(ns))
	}
	slices.SortStableFunc(row, func(a, b int) int { return cmp.Compare(key[a], key[b]) })
}

// positions gives each item its place in its row, scaled to [0, 1].
func (d *Drawing) positions() []float64 {
	pos := make([]float64, len(d.items))
	for _, row := range d.rows {
		for k, i := range row {
			pos[i] = (float64(k) + 0.5) / float64(len(row))
		}
	}
	return pos
}

// crossings counts the pairs of links that cross between adjacent rows.
func (d *Drawing) crossings() int {
	rank := make([]int, len(d.items))
	for _, row := range d.rows {
		for k, i := range row {
			rank[i] = k
		}
	}
	n := 0
	for r := 1; r < len(d.rows); r++ {
		var links [][2]int
		for _, i := range d.rows[r] {
			for _, j := range d.items[i].down {
				links = append(links, [2]int{rank[i], rank[j]})
			}
		}
		for a := range links {
			for b := a + 1; b < len(links); b++ {
				if (links[a][0]-links[b][0])*(links[a][1]-links[b][1]) < 0 {
					n++
				}
			}
		}
	}
	return n
}

func (d *Drawing) cloneRows() [][]int {
	out := make([][]int, len(d.rows))
	for r, row := range d.rows {
		out[r] = slices.Clone(row)
	}
	return out
}

// gap is the least distance between the centres of two neighbours.
func (d *Drawing) gap(a, b int) float64 {
	ia, ib := d.items[a], d.items[b]
	space := boxSpacing
	if ia.pkg < 0 || ib.pkg < 0 {
		space = passWidth
	}
	return ia.width/2 + ib.width/2 + space
}

// place gives every item its x: each is drawn towards the mean of its
// neighbours' (an import's points strongly towards each other, so that
// long imports run straight), and each row keeps its order and spacing
// by isotonic regression.
func (d *Drawing) place() {
	for _, row := range d.rows {
		x := 0.0
		for k, i := range row {
			if k > 0 {
				x += d.gap(row[k-1], i)
			}
			d.items[i].x = x
		}
		for _, i := range row {
			d.items[i].x -= x / 2
		}
	}
	for sweep := range 40 {
		for k := range d.rows {
			r := k
			if sweep%2 == 0 {
				r = len(d.rows) - 1 - k
			}
			d.placeRow(r)
		}
	}
	left := math.Inf(1)
	for _, it := range d.items {
		left = min(left, it.x-it.width/2)
	}
	for i := range d.items {
		d.items[i].x += margin - left
	}
}

func (d *Drawing) placeRow(r int) {
	row := d.rows[r]
	want := make([]float64, len(row))
	weight := make([]float64, len(row))
	for k, i := range row {
		it := d.items[i]
		sum, wsum := 0.0, 0.0
		for _, n := range slices.Concat(it.up, it.down) {
			w := 1.0
			if it.pkg < 0 && d.items[n].pkg < 0 {
				w = 8
			} else if it.pkg < 0 || d.items[n].pkg < 0 {
				w = 2
			}
			sum += w * d.items[n].x
			wsum += w
		}
		if wsum == 0 {
			want[k], weight[k] = it.x, 1
			continue
		}
		want[k], weight[k] = sum/wsum, wsum
	}
	// x[k] - x[k-1] >= gap: with offsets c[k], y[k] = x[k] - c[k] must
	// not decrease.
	c := make([]float64, len(row))
	for k := 1; k < len(row); k++ {
		c[k] = c[k-1] + d.gap(row[k-1], row[k])
	}
	y := make([]float64, len(row))
	for k := range row {
		y[k] = want[k] - c[k]
	}
	y = isotonic(y, weight)
	for k, i := range row {
		d.items[i].x = y[k] + c[k]
	}
}

// isotonic is the non-decreasing sequence closest to v in weighted least
// squares (pool adjacent violators).
func isotonic(v, w []float64) []float64 {
	type block struct {
		mean, weight float64
		n            int
	}
	var blocks []block
	for k := range v {
		blocks = append(blocks, block{v[k], w[k], 1})
		for len(blocks) > 1 && blocks[len(blocks)-2].mean > blocks[len(blocks)-1].mean {
			a, b := blocks[len(blocks)-2], blocks[len(blocks)-1]
			wt := a.weight + b.weight
			blocks = blocks[:len(blocks)-2]
			blocks = append(blocks, block{(a.mean*a.weight + b.mean*b.weight) / wt, wt, a.n + b.n})
		}
	}
	out := make([]float64, 0, len(v))
	for _, b := range blocks {
		for range b.n {
			out = append(out, b.mean)
		}
	}
	return out
}

// rowTop is the y of a row's top edge; the top row is drawn first.
func (d *Drawing) rowTop(r int) float64 {
	return headHeight + float64(len(d.rows)-1-r)*(boxHeight+rowGap)
}

func (d *Drawing) size() (w, h float64) {
	for _, it := range d.items {
		w = max(w, it.x+it.width/2)
	}
	return math.Ceil(w + margin), math.Ceil(d.rowTop(0) + boxHeight + margin)
}

// String names the rows and their packages, bottom up, for tests and
// debugging.
func (d *Drawing) String() string {
	var b strings.Builder
	for r, row := range d.rows {
		fmt.Fprintf(&b, "%d:", r)
		for _, i := range row {
			if p := d.items[i].pkg; p >= 0 {
				fmt.Fprintf(&b, " %s", d.Pkgs[p].Path)
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}
