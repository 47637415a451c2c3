package metrics_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/membership"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/coordinator/metrics"
)

// TestDashboardNamesExist: every gpuaas_ series the Grafana dashboard
// queries is one a coordinator exposes, so a renamed metric cannot leave
// a panel silently empty.
func TestDashboardNamesExist(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("grafana-dashboard.json")
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(b, &d))

	m := metrics.New()
	h := fsmtest.New(t)
	m.Registry().MustRegister(metrics.NewStoreCollector(h.FSM.Store, nil),
		metrics.NewAgentCollector(func() metrics.AgentView { return fakeView{statuses: []membership.Status{}} }))
	m.Registry().MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpuaas_raft_leader", Help: "as the server registers it"}))
	m.APIObserver("GET", "/v1/status")(200, time.Millisecond) // a vec without children is not gathered
	f := gather(t, m.Registry())

	name := regexp.MustCompile(`\bgpuaas_[a-z_]+`)
	seen := 0
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, n := range name.FindAllString(tg.Expr, -1) {
				seen++
				base := n
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if s, ok := strings.CutSuffix(n, suffix); ok && f[s] != nil {
						base = s
					}
				}
				assert.Contains(t, f, base, "panel %q queries %s", p.Title, n)
			}
		}
	}
	assert.Greater(t, seen, 10)
}
