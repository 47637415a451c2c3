// Package bench writes the benchmark report of ../shared/DESIGN.md: a JSON
// array of metrics plus a Markdown table, under test/bench/results/.
//
// Each benchmark area writes its own part file (results/parts/<area>.json)
// with WritePart; Merge (run by `make bench` last) folds every part into
// results/latest.json and results/latest.md, so areas can be re-run alone.
package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Metric is one measured figure. Target describes the goal ("< 1", ">= 0.5");
// Met says whether Value reached it. Ratios against a reference tool are
// measured in the same run and say so in Notes.
type Metric struct {
	Metric     string    `json:"metric"`
	Value      float64   `json:"value"`
	Unit       string    `json:"unit"`
	Target     string    `json:"target"`
	Met        bool      `json:"met"`
	MeasuredAt time.Time `json:"measured_at"`
	Notes      string    `json:"notes"`
}

// AtMost builds a metric whose goal is value <= target.
func AtMost(name string, value float64, unit string, target float64, notes string) Metric {
	return Metric{Metric: name, Value: value, Unit: unit, Target: fmt.Sprintf("<= %g", target),
		Met: value <= target, MeasuredAt: time.Now().UTC(), Notes: notes}
}

// AtLeast builds a metric whose goal is value >= target.
func AtLeast(name string, value float64, unit string, target float64, notes string) Metric {
	return Metric{Metric: name, Value: value, Unit: unit, Target: fmt.Sprintf(">= %g", target),
		Met: value >= target, MeasuredAt: time.Now().UTC(), Notes: notes}
}

// Info builds a metric with no target (reported for context, always met).
func Info(name string, value float64, unit string, notes string) Metric {
	return Metric{Metric: name, Value: value, Unit: unit, Target: "none",
		Met: true, MeasuredAt: time.Now().UTC(), Notes: notes}
}

// ResultsDir returns the results directory: $GPUAAS_BENCH_RESULTS if set,
// else test/bench/results relative to the module root found from the
// working directory.
func ResultsDir() (string, error) {
	if d := os.Getenv("GPUAAS_BENCH_RESULTS"); d != "" {
		return d, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "test", "bench", "results"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("bench results: no go.mod above the working directory")
		}
		dir = parent
	}
}

// WritePart writes the metrics of one area to results/parts/<area>.json.
func WritePart(area string, metrics []Metric) error {
	dir, err := ResultsDir()
	if err != nil {
		return err
	}
	parts := filepath.Join(dir, "parts")
	if err := os.MkdirAll(parts, 0o755); err != nil {
		return fmt.Errorf("bench part %s: %w", area, err)
	}
	b, err := json.MarshalIndent(metrics, "", "  ")
	if err != nil {
		return fmt.Errorf("bench part %s: %w", area, err)
	}
	return os.WriteFile(filepath.Join(parts, area+".json"), append(b, '\n'), 0o644)
}

// Merge folds every part file into latest.json and latest.md in dir.
func Merge(dir string) ([]Metric, error) {
	files, err := filepath.Glob(filepath.Join(dir, "parts", "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var all []Metric
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var ms []Metric
		if err := json.Unmarshal(b, &ms); err != nil {
			return nil, fmt.Errorf("bench part %s: %w", f, err)
		}
		all = append(all, ms...)
	}
	all = append(all, Derived(all)...)
	b, err := json.MarshalIndent(all, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "latest.json"), append(b, '\n'), 0o644); err != nil {
		return nil, err
	}
	return all, os.WriteFile(filepath.Join(dir, "latest.md"), []byte(Markdown(all)), 0o644)
}

// Ratio is a figure derived from two measured ones in the same `make
// bench` run: Num / Den, with the goal Target (">= g").
type Ratio struct {
	Metric, Num, Den string
	Target           float64
	Notes            string
}

// Ratios are the derived figures Merge adds when both sides are present.
var Ratios = []Ratio{
	{Metric: "placements_vs_etcd_claims_ratio", Num: "placements_per_s_3voters", Den: "etcd_claims_per_s_3members", Target: 1,
		Notes: "a full gpuaas placement (decision included) per second vs a bare etcd slot claim per second (test/bench/etcdref), same slot count and client count, same make bench run on the same machine"},
}

// Derived computes Ratios from ms. Parts measured more than 2 hours apart
// are not from one run: the ratio is then not reported.
func Derived(ms []Metric) []Metric {
	byName := map[string]Metric{}
	for _, m := range ms {
		byName[m.Metric] = m
	}
	var out []Metric
	for _, r := range Ratios {
		n, ok1 := byName[r.Num]
		d, ok2 := byName[r.Den]
		if !ok1 || !ok2 || d.Value == 0 {
			continue
		}
		gap := n.MeasuredAt.Sub(d.MeasuredAt)
		if gap < 0 {
			gap = -gap
		}
		if gap > 2*time.Hour {
			continue
		}
		at := n.MeasuredAt
		if d.MeasuredAt.After(at) {
			at = d.MeasuredAt
		}
		m := AtLeast(r.Metric, n.Value/d.Value, "ratio", r.Target,
			fmt.Sprintf("%s (%.4g) / %s (%.4g); %s", r.Num, n.Value, r.Den, d.Value, r.Notes))
		m.MeasuredAt = at
		out = append(out, m)
	}
	return out
}

// Markdown renders metrics as a table.
func Markdown(ms []Metric) string {
	var sb strings.Builder
	sb.WriteString("# gpuaas benchmark report\n\n")
	sb.WriteString("| metric | value | unit | target | met | measured at | notes |\n|---|---|---|---|---|---|---|\n")
	for _, m := range ms {
		met := "yes"
		if !m.Met {
			met = "**no**"
		}
		fmt.Fprintf(&sb, "| %s | %.4g | %s | %s | %s | %s | %s |\n", m.Metric, m.Value, m.Unit, m.Target, met,
			m.MeasuredAt.Format(time.RFC3339), strings.ReplaceAll(m.Notes, "|", "/"))
	}
	return sb.String()
}
