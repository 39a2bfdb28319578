package ration_test

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// readme is README.md with every run of white space made one space, so
// that a phrase matches wherever the text wraps.
func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(strings.Fields(string(b)), " ")
}

// oneKeyRequestScenarios are the simulator's scenarios of one key charged
// per request: the set the README's calls-per-admission figures cover.
var oneKeyRequestScenarios = []string{"uniform", "zipf", "one", "rotating", "bursts", "moving", "autoscale", "outage", "lossy"}

// TestReadmeFigures checks each simulator figure the README quotes
// against the simulator's committed output (docs/sim, written by
// `go run ./sim -out docs/sim -markdown` and the sweep in docs/sim.md):
// when they are regenerated, a README figure that no longer holds fails
// here, naming the phrase it should read.
func TestReadmeFigures(t *testing.T) {
	text := readme(t)
	results := readCSV(t, "docs/sim/results.csv")
	budgets := readCSV(t, "docs/sim/budgets.csv")
	sweep := readSweep(t, "docs/sim/sweep.md")

	vsIdeal := func(rows []map[string]string, scenario, strategy string) float64 {
		t.Helper()
		for _, r := range rows {
			if r["scenario"] == scenario && r["strategy"] == strategy {
				return 100 * number(t, r["vs_ideal"])
			}
		}
		t.Fatalf("results.csv has no row for %s/%s", scenario, strategy)
		return 0
	}
	callsPerAdmission := func(load string) (lo, hi float64) {
		t.Helper()
		lo, hi = math.Inf(1), math.Inf(-1)
		n := 0
		for _, r := range sweep {
			if r["strategy"] == "leased" && r["N"] == "8" && r["load"] == load && slices.Contains(oneKeyRequestScenarios, r["scenario"]) {
				v := number(t, r["calls/adm"])
				lo, hi = min(lo, v), max(hi, v)
				n++
			}
		}
		if n != len(oneKeyRequestScenarios) {
			t.Fatalf("sweep.md has %d leased rows at N=8, load %s, for the %d one-key request scenarios", n, load, len(oneKeyRequestScenarios))
		}
		return lo, hi
	}
	lo08, hi08 := callsPerAdmission("0.8×")
	lo2, hi2 := callsPerAdmission("2×")
	budgetLo, budgetHi := math.Inf(1), math.Inf(-1)
	for _, r := range budgets {
		if r["strategy"] == "leased" && (r["scenario"] == "team" || r["scenario"] == "tokens-io") {
			v := 100 * number(t, r["vs_ideal"])
			budgetLo, budgetHi = min(budgetLo, v), max(budgetHi, v)
		}
	}

	for _, want := range []string{
		fmt.Sprintf("a static per-instance split admits %.1f%% of the limit", vsIdeal(results, "one", "static")),
		fmt.Sprintf("the leased fleet admits %.0f%% of what one exact bucket would", vsIdeal(results, "one", "leased")),
		fmt.Sprintf("it makes %.3f–%.3f allocator calls per admission at 0.8× the limit and %.3f–%.3f at twice the limit", lo08, hi08, lo2, hi2),
		fmt.Sprintf("a leased fleet admits %.0f–%.0f%% of what one exact bucket per budget admits", budgetLo, budgetHi),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("README.md should say, from docs/sim: %q", want)
		}
	}
}

// TestReadmeLinksEveryDocAndPackage checks that the README links every page of
// docs/ and lists every package of the module in its layout (a package
// whose files are all generated is covered by its parent directory).
func TestReadmeLinksEveryDocAndPackage(t *testing.T) {
	text := readme(t)
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if !strings.Contains(text, "("+d+")") && !strings.Contains(text, "("+d+"#") {
			t.Errorf("README.md does not link %s", d)
		}
	}

	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, layout, found := strings.Cut(string(b), "## Layout\n\n```\n")
	layout, _, _ = strings.Cut(layout, "```")
	if !found {
		t.Fatal("README.md has no layout block")
	}
	listed := map[string]bool{}
	dirName := regexp.MustCompile(`^[a-z][a-z0-9_./-]*/$`)
	for _, line := range strings.Split(layout, "\n") {
		first, _, _ := strings.Cut(line, "  ")
		for _, d := range strings.Split(first, ", ") {
			if d = strings.TrimSpace(d); dirName.MatchString(d) {
				listed[strings.TrimSuffix(d, "/")] = true
			}
		}
	}
	err = filepath.WalkDir(".", func(path string, e fs.DirEntry, err error) error {
		if err != nil || !e.IsDir() {
			return err
		}
		if path != "." && (strings.HasPrefix(e.Name(), ".") || e.Name() == "testdata") {
			return filepath.SkipDir
		}
		if path == "." || listed[path] {
			return nil
		}
		if handWritten, err := hasHandWrittenGo(path); err != nil {
			return err
		} else if handWritten {
			t.Errorf("README.md's layout does not list the package %s/", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// hasHandWrittenGo reports whether dir holds a .go file other than a test
// and other than generated code.
func hasHandWrittenGo(dir string) (bool, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return false, err
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return false, err
		}
		if !bytes.Contains(b, []byte("DO NOT EDIT.")) {
			return true, nil
		}
	}
	return false, nil
}

func readCSV(t *testing.T, path string) []map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return rowsOf(t, path, recs)
}

// readSweep reads the first table of the sweep's Markdown output, the
// one row per scenario, strategy, fleet size and load.
func readSweep(t *testing.T, path string) []map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var recs [][]string
	for i, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "|") {
			break
		}
		if i == 1 { // the header's --- line
			continue
		}
		var cells []string
		for _, c := range strings.Split(strings.Trim(line, "|"), "|") {
			cells = append(cells, strings.TrimSpace(c))
		}
		recs = append(recs, cells)
	}
	return rowsOf(t, path, recs)
}

func rowsOf(t *testing.T, path string, recs [][]string) []map[string]string {
	t.Helper()
	if len(recs) < 2 {
		t.Fatalf("%s: no rows", path)
	}
	var rows []map[string]string
	for _, rec := range recs[1:] {
		if len(rec) != len(recs[0]) {
			t.Fatalf("%s: a row of %d cells under a header of %d", path, len(rec), len(recs[0]))
		}
		r := map[string]string{}
		for i, h := range recs[0] {
			r[h] = rec[i]
		}
		rows = append(rows, r)
	}
	return rows
}

func number(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
	if err != nil {
		t.Fatalf("not a number: %q", s)
	}
	return v
}
