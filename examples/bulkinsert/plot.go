package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// plotCompare reads the output of -mode compare runs (one file a set) and
// writes an SVG dot plot of each set's per-pair ratios, its median, and
// the 10× line: the figure in docs/lab.md. Files are named by
// their base name without extension (e.g. nats-set1).
func plotCompare(files []string, out io.Writer) error {
	type set struct {
		name   string
		ratios []float64
	}
	var sets []set
	top := 12.0
	for _, f := range files {
		s := set{name: strings.TrimSuffix(filepath.Base(f), filepath.Ext(f))}
		fh, err := os.Open(f)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			var p int
			var r float64
			if n, _ := fmt.Sscanf(sc.Text(), "pair %d: batch/single = %fx", &p, &r); n == 2 {
				s.ratios = append(s.ratios, r)
				top = max(top, r+2)
			}
		}
		fh.Close()
		if len(s.ratios) == 0 {
			return fmt.Errorf("bulkinsert: no \"pair N: batch/single = Rx\" line in %s", f)
		}
		sets = append(sets, s)
	}
	const w, h, left, bottom, topPad = 640, 320, 50, 60, 20
	colW := float64(w-left-10) / float64(len(sets))
	y := func(r float64) float64 { return topPad + (1-r/top)*float64(h-topPad-bottom) }
	fmt.Fprintf(out, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", w, h)
	fmt.Fprintf(out, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	for r := 0.0; r <= top; r += 2 {
		fmt.Fprintf(out, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%g×</text>`+"\n",
			left, w-10, y(r), y(r), left-4, y(r)+4, r)
	}
	fmt.Fprintf(out, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#c00" stroke-dasharray="4 3"/><text x="%d" y="%.1f" fill="#c00">target 10×</text>`+"\n",
		left, w-10, y(10), y(10), w-80, y(10)-4)
	for i, s := range sets {
		cx := float64(left) + colW*(float64(i)+0.5)
		sorted := slices.Clone(s.ratios)
		slices.Sort(sorted)
		med := sorted[len(sorted)/2]
		fmt.Fprintf(out, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#333" stroke-width="2"/>`+"\n", cx-colW/4, cx+colW/4, y(med), y(med))
		fmt.Fprintf(out, `<text x="%.1f" y="%.1f" text-anchor="middle">%.1f×</text>`+"\n", cx+colW/4+16, y(med)+4, med)
		for j, r := range s.ratios {
			dx := (float64(j) - float64(len(s.ratios)-1)/2) * 8
			fmt.Fprintf(out, `<circle cx="%.1f" cy="%.1f" r="4" fill="#2a6ebb" fill-opacity="0.7"/>`+"\n", cx+dx, y(r))
		}
		fmt.Fprintf(out, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", cx, h-bottom+16, s.name)
	}
	fmt.Fprintf(out, `<text x="%d" y="%d" text-anchor="middle">batch route ÷ per-message route throughput, each dot one interleaved pair, bar the set's median</text>`+"\n", w/2, h-12)
	fmt.Fprintln(out, "</svg>")
	return nil
}
