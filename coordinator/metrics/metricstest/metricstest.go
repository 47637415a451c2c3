// Package metricstest reads Prometheus expositions in tests: it parses
// the text format with prometheus/common/expfmt (never with regular
// expressions) and looks samples up by name and labels.
package metricstest

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families is an exposition by metric family name.
type Families map[string]*dto.MetricFamily

// Parse reads an exposition in the Prometheus text format.
func Parse(r io.Reader) (Families, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	f, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse exposition: %w", err)
	}
	return f, nil
}

// Gather collects g (a registry) into Families.
func Gather(g prometheus.Gatherer) (Families, error) {
	mfs, err := g.Gather()
	if err != nil {
		return nil, fmt.Errorf("gather: %w", err)
	}
	out := Families{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out, nil
}

// Value returns the value of the sample of family name whose labels
// include labels (pairs: name, value, ...): a counter's or gauge's value,
// a histogram's or summary's sample count. ok is false when no sample
// matches.
func (f Families) Value(name string, labels ...string) (v float64, ok bool) {
	m := f.find(name, labels)
	if m == nil {
		return 0, false
	}
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount()), true
	case m.Summary != nil:
		return float64(m.Summary.GetSampleCount()), true
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true
	}
	return 0, false
}

// Sum adds Value over every sample of name whose labels include labels.
func (f Families) Sum(name string, labels ...string) float64 {
	mf := f[name]
	if mf == nil {
		return 0
	}
	var sum float64
	for _, m := range mf.Metric {
		if !matches(m, labels) {
			continue
		}
		one := Families{name: &dto.MetricFamily{Name: mf.Name, Type: mf.Type, Metric: []*dto.Metric{m}}}
		v, _ := one.Value(name)
		sum += v
	}
	return sum
}

// Names lists the family names, sorted (for failure messages).
func (f Families) Names() string {
	return strings.Join(slices.Sorted(maps.Keys(f)), " ")
}

func (f Families) find(name string, labels []string) *dto.Metric {
	mf := f[name]
	if mf == nil {
		return nil
	}
	for _, m := range mf.Metric {
		if matches(m, labels) {
			return m
		}
	}
	return nil
}

func matches(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, lp := range m.Label {
			if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
