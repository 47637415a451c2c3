package fleetsim

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/proto"
)

// PlaceConfig shapes the placement stream: API clients creating GPU
// slices and releasing each after Hold.
type PlaceConfig struct {
	// APIs are operator API clients, one per coordinator (requests
	// spread over them; a follower forwards a placement to the leader).
	APIs   []*cli.Client
	Region string
	SKU    string // default h200-sxm-slice
	// Clients is the number of concurrent API clients (default 4).
	Clients int
	// Rate caps the placements per second over all clients (0: back to
	// back).
	Rate float64
	// Hold is how long an allocation lives before its release (default
	// 2 s).
	Hold time.Duration
}

// PlaceStats is what the stream measured. Latencies are of POST
// /v1/allocations, from the request to the committed answer (the
// placement decision, its Raft commit on a majority and the applied
// allocation), in milliseconds.
type PlaceStats struct {
	Placed, Refused, Failed, Released int64
	// ReleaseFailed counts releases that did not go through in 30 s.
	ReleaseFailed int64
	LatenciesMS   []float64
	LastError     string
	// LastPlaceError is the last failed placement's error.
	LastPlaceError string
	// Slow are the placements that took SlowMS or longer, in the order
	// they ended: when each started and through which coordinator, to
	// line them up with the coordinators' logs and profiles.
	Slow []SlowPlacement
}

// SlowMS is the latency from which a placement is listed in
// PlaceStats.Slow (the fleet's p99 goal).
const SlowMS = 50

// SlowPlacement is one placement that took SlowMS or longer.
type SlowPlacement struct {
	Start time.Time
	MS    float64
	// API is the index of the coordinator (PlaceConfig.APIs) it went to.
	API int
	Err string
}

// Quantile returns the q-quantile of the latencies (0 with none).
func (s PlaceStats) Quantile(q float64) float64 {
	if len(s.LatenciesMS) == 0 {
		return 0
	}
	l := slices.Clone(s.LatenciesMS)
	slices.Sort(l)
	i := int(q * float64(len(l)-1))
	return l[i]
}

// Place runs the placement stream until ctx ends and returns its
// measurements once every held allocation was released.
func Place(ctx context.Context, cfg PlaceConfig) (PlaceStats, error) {
	if len(cfg.APIs) == 0 {
		return PlaceStats{}, fmt.Errorf("fleetsim place: no API client")
	}
	if cfg.Region == "" {
		return PlaceStats{}, fmt.Errorf("fleetsim place: no region")
	}
	if cfg.SKU == "" {
		cfg.SKU = "h200-sxm-slice"
	}
	if cfg.Clients <= 0 {
		cfg.Clients = 4
	}
	if cfg.Hold <= 0 {
		cfg.Hold = 2 * time.Second
	}
	var (
		mu           sync.Mutex
		st           PlaceStats
		keys         atomic.Int64
		relWG        sync.WaitGroup
		lastErr      atomic.Pointer[string]
		lastPlaceErr atomic.Pointer[string]
	)
	fail := func(err error) {
		s := err.Error()
		lastErr.Store(&s)
	}
	var tick <-chan time.Time
	if cfg.Rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / cfg.Rate))
		defer t.Stop()
		tick = t.C
	}
	relCtx := context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for c := range cfg.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for {
				if tick != nil {
					select {
					case <-ctx.Done():
						return
					case <-tick:
					}
				} else if ctx.Err() != nil {
					return
				}
				ai := rng.IntN(len(cfg.APIs))
				api := cfg.APIs[ai]
				req := proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: cfg.SKU,
					GPUCount: []int{1, 1, 2, 4}[rng.IntN(4)], Region: cfg.Region}
				h := http.Header{}
				h.Set(proto.IdempotencyKeyHeader, fmt.Sprintf("fleetsim-%d-%d", time.Now().UnixNano(), keys.Add(1)))
				t0 := time.Now()
				r, err := api.Do(ctx, http.MethodPost, "/v1/allocations", nil, req, h)
				ms := float64(time.Since(t0).Microseconds()) / 1000
				if ctx.Err() != nil {
					return
				}
				if ms >= SlowMS {
					sp := SlowPlacement{Start: t0, MS: ms, API: ai}
					if err != nil {
						sp.Err = err.Error()
					}
					mu.Lock()
					st.Slow = append(st.Slow, sp)
					mu.Unlock()
				}
				if err != nil {
					mu.Lock()
					if proto.CodeOf(err) == proto.CodeNoCapacity {
						st.Refused++
					} else {
						st.Failed++
						fail(err)
						s := err.Error()
						lastPlaceErr.Store(&s)
					}
					mu.Unlock()
					continue
				}
				var a proto.Allocation
				if err := json.Unmarshal(r.Body, &a); err != nil {
					fail(fmt.Errorf("decode allocation: %w", err))
					continue
				}
				mu.Lock()
				st.Placed++
				st.LatenciesMS = append(st.LatenciesMS, ms)
				mu.Unlock()
				relWG.Add(1)
				go func() {
					defer relWG.Done()
					time.Sleep(cfg.Hold)
					if err := release(relCtx, api, a.ID); err != nil {
						fail(err)
						mu.Lock()
						st.ReleaseFailed++
						mu.Unlock()
						return
					}
					mu.Lock()
					st.Released++
					mu.Unlock()
				}()
			}
		}()
	}
	wg.Wait()
	relWG.Wait()
	if p := lastErr.Load(); p != nil {
		st.LastError = *p
	}
	if p := lastPlaceErr.Load(); p != nil {
		st.LastPlaceError = *p
	}
	return st, nil
}

// release releases an allocation, retrying while it is still being
// provisioned (the agent acknowledges the provision task first).
func release(ctx context.Context, api *cli.Client, id string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := api.Do(ctx, http.MethodPost, "/v1/allocations/"+url.PathEscape(id)+"/release", nil, struct{}{}, nil)
		if err == nil {
			return nil
		}
		if proto.CodeOf(err) == proto.CodeIllegalTransition {
			// An earlier attempt whose answer was lost may have committed.
			if r, gerr := api.Do(ctx, http.MethodGet, "/v1/allocations/"+url.PathEscape(id), url.Values{"consistent": {"true"}}, nil, nil); gerr == nil {
				var a proto.Allocation
				if json.Unmarshal(r.Body, &a) == nil && (a.State == proto.AllocReleasing || a.State == proto.AllocReleased) {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("release %s: %w", id, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// APIMinter mints bootstrap tokens through the operator API, spreading
// the requests over apis.
func APIMinter(apis []*cli.Client, ttl time.Duration) Minter {
	var n atomic.Int64
	return func(ctx context.Context, node string) (string, error) {
		api := apis[int(n.Add(1))%len(apis)]
		r, err := api.Do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(node)+"/bootstrap-tokens", nil,
			proto.BootstrapTokenCreateRequest{TTLSeconds: int(ttl / time.Second)}, nil)
		if err != nil {
			return "", fmt.Errorf("mint bootstrap token for %s: %w", node, err)
		}
		var t proto.BootstrapTokenResponse
		if err := json.Unmarshal(r.Body, &t); err != nil {
			return "", fmt.Errorf("mint bootstrap token for %s: decode: %w", node, err)
		}
		return t.Token, nil
	}
}

// NodeState reads a node's state through api (a consistent read).
func NodeState(ctx context.Context, api *cli.Client, node string) (proto.NodeState, error) {
	r, err := api.Do(ctx, http.MethodGet, "/v1/nodes/"+url.PathEscape(node), url.Values{"consistent": {"true"}}, nil, nil)
	if err != nil {
		return "", err
	}
	var d proto.NodeDetail
	if err := json.Unmarshal(r.Body, &d); err != nil {
		return "", fmt.Errorf("node %s: decode: %w", node, err)
	}
	return d.Node.State, nil
}
