package fleetsim

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/cli"
)

// The fleet benchmark's placement stream runs in a process of its own:
// a tenant's API client is not inside the 10,000 simulated hosts, and in
// the simulator's process its requests would wait on the simulator's own
// garbage collection (assists) and scheduling, which the coordinators'
// logs showed as second-long gaps between a placement's start and its
// arrival at any coordinator. The test binary runs itself again with
// placerEnv set; TestMain then runs the stream and exits.

// placerEnv carries a placerJob (JSON) to the child process.
const placerEnv = "GPUAAS_FLEET_PLACER"

// placerJob is what the child needs to run Place.
type placerJob struct {
	URLs     []string      `json:"urls"`
	Token    string        `json:"token"`
	CAFile   string        `json:"ca_file"`
	Region   string        `json:"region"`
	Clients  int           `json:"clients"`
	Rate     float64       `json:"rate"`
	Hold     time.Duration `json:"hold"`
	Duration time.Duration `json:"duration"`
	Out      string        `json:"out"` // where the child writes its PlaceStats (JSON)
}

func TestMain(m *testing.M) {
	if v := os.Getenv(placerEnv); v != "" {
		if err := runPlacerJob(v); err != nil {
			fmt.Fprintln(os.Stderr, "fleetsim placer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runPlacerJob is the child: it runs the stream for the job's duration
// and writes what it measured.
func runPlacerJob(v string) error {
	var job placerJob
	if err := json.Unmarshal([]byte(v), &job); err != nil {
		return fmt.Errorf("%s: %w", placerEnv, err)
	}
	if len(job.URLs) == 0 || job.Out == "" || job.Duration <= 0 {
		return fmt.Errorf("%s: urls, out and duration are required", placerEnv)
	}
	var apis []*cli.Client
	for _, u := range job.URLs {
		api, err := cli.NewClient(u, job.Token, job.CAFile)
		if err != nil {
			return err
		}
		apis = append(apis, api)
	}
	ctx, cancel := context.WithTimeout(context.Background(), job.Duration)
	defer cancel()
	ps, err := Place(ctx, PlaceConfig{APIs: apis, Region: job.Region, Clients: job.Clients, Rate: job.Rate, Hold: job.Hold})
	if err != nil {
		return err
	}
	b, err := json.Marshal(ps)
	if err != nil {
		return err
	}
	return os.WriteFile(job.Out, b, 0o644)
}

// placeInProcess runs Place in a child process against the cluster's
// coordinators for d and returns what it measured.
func placeInProcess(t *testing.T, c *cluster, d time.Duration, cfg PlaceConfig) (PlaceStats, error) {
	var urls []string
	for i := range c.Nodes {
		urls = append(urls, c.URL(i))
	}
	job := placerJob{URLs: urls, Token: "proctest-admin-token", CAFile: c.CAFile, Region: cfg.Region,
		Clients: cfg.Clients, Rate: cfg.Rate, Hold: cfg.Hold, Duration: d,
		Out: filepath.Join(t.TempDir(), "place.json")}
	b, err := json.Marshal(job)
	if err != nil {
		return PlaceStats{}, err
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), placerEnv+"="+string(b))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return PlaceStats{}, fmt.Errorf("placer process: %w: %s", err, out)
	}
	var ps PlaceStats
	raw, err := os.ReadFile(job.Out)
	if err != nil {
		return PlaceStats{}, fmt.Errorf("placer process: %w", err)
	}
	if err := json.Unmarshal(raw, &ps); err != nil {
		return PlaceStats{}, fmt.Errorf("placer process: %s: %w", job.Out, err)
	}
	return ps, nil
}
