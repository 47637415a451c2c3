package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
	"github.com/gpuaas/gpuaas/proto"
)

// Workload is the clients: each creates slice allocations with its own
// idempotency keys (re-sending a key until it learns the outcome), reads
// allocations (its own and others') and slots with ?consistent=true, and
// force-releases what it holds, each request to a random coordinator.
type Workload struct {
	C       *proctest.Cluster
	H       *History
	Clients int
	Region  string
	SKU     string
	// Slots are the slot IDs reads pick from.
	Slots []string
	// Nodes, when set, says which coordinators client cl may talk to now
	// (e.g. only the majority side of a partition); default: all.
	Nodes func(cl int) []int
	// Timeout bounds each request (the client gives up: unknown outcome).
	Timeout time.Duration
	Seed    uint64

	mu    sync.Mutex
	known []held // acknowledged allocations, for reads by any client
}

type held struct {
	key, id string
}

// Run runs the clients until ctx ends; then each client finishes the
// create or release it is in the middle of (re-sending until it learns
// the outcome) for up to settle, so the history ends with few unknowns.
func (w *Workload) Run(ctx context.Context, settle time.Duration) {
	var wg sync.WaitGroup
	for cl := range w.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.client(ctx, cl, settle)
		}()
	}
	wg.Wait()
}

func (w *Workload) client(ctx context.Context, cl int, settle time.Duration) {
	rng := rand.New(rand.NewPCG(w.Seed, uint64(cl)))
	// Pending work must finish after ctx ends: it runs under its own
	// deadline.
	finish := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), settle)
	}
	var mine []held
	for seq := 0; ctx.Err() == nil; seq++ {
		r := rng.Float64()
		switch {
		case len(mine) < 4 && r < 0.35:
			fctx, cancel := finish()
			key := fmt.Sprintf("w%d-c%02d-%05d", w.Seed%1000, cl, seq)
			gpus := []int{1, 1, 2}[rng.IntN(3)]
			if id, ok := w.create(ctx, fctx, rng, cl, key, gpus); ok {
				mine = append(mine, held{key, id})
				w.mu.Lock()
				w.known = append(w.known, held{key, id})
				w.mu.Unlock()
			} else if len(mine) > 0 {
				// No capacity: give one back so capacity turns over.
				w.release(ctx, fctx, rng, cl, mine[0])
				mine = mine[1:]
			}
			cancel()
		case len(mine) > 0 && r < 0.5:
			fctx, cancel := finish()
			w.release(ctx, fctx, rng, cl, mine[0])
			mine = mine[1:]
			cancel()
		case r < 0.85:
			w.mu.Lock()
			var h held
			if n := len(w.known); n > 0 {
				// Mostly recent allocations: where stale reads show.
				h = w.known[n-1-min(n-1, int(rng.ExpFloat64()*8))]
			}
			w.mu.Unlock()
			if h.id != "" {
				w.read(ctx, rng, cl, h)
			}
		default:
			if len(w.Slots) > 0 {
				w.readSlot(ctx, rng, cl, w.Slots[rng.IntN(len(w.Slots))])
			}
		}
	}
}

// node picks the coordinator for one request.
func (w *Workload) node(rng *rand.Rand, cl int) int {
	if w.Nodes != nil {
		if ns := w.Nodes(cl); len(ns) > 0 {
			return ns[rng.IntN(len(ns))]
		}
	}
	return rng.IntN(len(w.C.Nodes))
}

// do sends one request and records it.
// idem is the Idempotency-Key header (creates only).
func (w *Workload) do(ctx context.Context, rng *rand.Rand, op Op, idem, method, path string, body, out any) Op {
	op.Node = w.node(rng, op.Client)
	rctx, cancel := context.WithTimeout(ctx, w.Timeout)
	defer cancel()
	op.Call = w.H.Now()
	code, err := w.C.Do(rctx, op.Node, method, path, idem, body, out)
	op.Return = w.H.Now()
	op.Status = code
	op.Result = classify(code, err)
	if err != nil {
		op.Err = err.Error()
		if errors.Is(err, context.DeadlineExceeded) {
			op.Err = fmt.Sprintf("no answer within %s: %v", w.Timeout, err)
		}
	}
	return op
}

// create re-sends key until the outcome is known or fctx ends; ok says an
// allocation was acknowledged.
func (w *Workload) create(ctx, fctx context.Context, rng *rand.Rand, cl int, key string, gpus int) (string, bool) {
	req := proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: w.SKU, GPUCount: gpus, Region: w.Region}
	for attempt := 0; fctx.Err() == nil; attempt++ {
		if attempt > 0 {
			sleep(fctx, 100*time.Millisecond)
		}
		var a proto.Allocation
		op := w.do(fctx, rng, Op{Client: cl, Kind: OpCreate, Key: key}, key, http.MethodPost, "/v1/allocations", req, &a)
		if op.Result == ResOK {
			op.AllocID, op.ClaimIDs, op.Ended = a.ID, a.ClaimIDs, !a.Live()
			op.Created = op.Status == http.StatusCreated
		}
		w.H.Add(op)
		switch op.Result {
		case ResOK:
			return a.ID, true
		case ResUnknown:
			continue
		default:
			return "", false
		}
	}
	return "", false
}

// release force-releases h until the outcome is known or fctx ends.
func (w *Workload) release(ctx, fctx context.Context, rng *rand.Rand, cl int, h held) {
	for attempt := 0; fctx.Err() == nil; attempt++ {
		if attempt > 0 {
			sleep(fctx, 100*time.Millisecond)
		}
		op := w.do(fctx, rng, Op{Client: cl, Kind: OpRelease, Key: h.key, AllocID: h.id}, "", http.MethodPost,
			"/v1/allocations/"+url.PathEscape(h.id)+"/force-release", map[string]string{"reason": "chaos workload"}, nil)
		w.H.Add(op)
		if op.Result != ResUnknown {
			return
		}
	}
}

func (w *Workload) read(ctx context.Context, rng *rand.Rand, cl int, h held) {
	var a proto.Allocation
	op := w.do(ctx, rng, Op{Client: cl, Kind: OpRead, Key: h.key, AllocID: h.id}, "", http.MethodGet,
		"/v1/allocations/"+url.PathEscape(h.id)+"?consistent=true", nil, &a)
	if op.Result == ResOK {
		op.Ended = !a.Live()
	}
	w.H.Add(op)
}

func (w *Workload) readSlot(ctx context.Context, rng *rand.Rand, cl int, id string) {
	var s proto.Slot
	op := w.do(ctx, rng, Op{Client: cl, Kind: OpReadSlot, SlotID: id}, "", http.MethodGet,
		"/v1/slots/"+url.PathEscape(id)+"?consistent=true", nil, &s)
	if op.Result == ResOK {
		op.ClaimID = s.ClaimID
	}
	w.H.Add(op)
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
