package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The plot has a dot per pair and each set's median, read from -mode
// compare's output lines.
func TestPlotCompare(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	a := write("nats-set1.txt", "single ...\npair 1: batch/single = 7.5x (mean batch 96.0)\npair 2: batch/single = 9.7x (mean batch 94.0)\npair 3: batch/single = 7.1x (mean batch 98.0)\n")
	b := write("kafka-set1.txt", "pair 1: batch/single = 13.4x (mean batch 99.8)\npair 2: batch/single = 15.0x (mean batch 100.0)\n")
	var out strings.Builder
	if err := plotCompare([]string{a, b}, &out); err != nil {
		t.Fatal(err)
	}
	svg := out.String()
	if n := strings.Count(svg, "<circle"); n != 5 {
		t.Fatalf("%d dots, want 5", n)
	}
	for _, want := range []string{">7.5×<", ">15.0×<", ">nats-set1<", ">kafka-set1<", "target 10×"} {
		if !strings.Contains(svg, want) {
			t.Fatalf("no %q in the plot", want)
		}
	}
	if err := plotCompare([]string{write("empty.txt", "nothing\n")}, &out); err == nil {
		t.Fatal("a file without pairs was accepted")
	}
}
