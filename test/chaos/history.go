package chaos

import (
	"net/http"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// Kind is what an operation did.
type Kind string

const (
	OpCreate   Kind = "create"    // POST /v1/allocations with an idempotency key
	OpRead     Kind = "read"      // GET /v1/allocations/{id}?consistent=true
	OpRelease  Kind = "release"   // POST /v1/allocations/{id}/force-release
	OpReadSlot Kind = "read_slot" // GET /v1/slots/{id}?consistent=true
)

// Result is how an operation ended, as the client saw it.
type Result string

const (
	ResOK       Result = "ok"        // 2xx
	ResNoCap    Result = "no_cap"    // create refused: no capacity
	ResNotFound Result = "not_found" // 404
	ResAlready  Result = "already"   // release of an allocation already released
	// ResUnknown is an unknown outcome: transport error, timeout, 5xx. The
	// operation may or may not have taken effect; for reads the record is
	// dropped (a read has no effect).
	ResUnknown Result = "unknown"
)

// Op is one client operation with its invoke and return times (since the
// run started, monotonic).
type Op struct {
	Client  int
	Node    int // coordinator the request was sent to
	Kind    Kind
	Key     string // idempotency key of the allocation (create, read, release)
	AllocID string
	SlotID  string // read_slot

	Call, Return time.Duration
	Result       Result
	// Outputs: create: AllocID and ClaimIDs; read: Ended (released or
	// failed); read_slot: ClaimID (the live claim, "" when free).
	ClaimIDs []string
	Created  bool // create answered 201: this request made the allocation
	Ended    bool
	ClaimID  string
	State    proto.AllocState // create, read (workflow rig): the allocation's state
	Status   int              // HTTP status, 0 on transport error
	Err      string           // error text on anything but ok
}

// History is the shared, append-only record of a run.
type History struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
}

// NewHistory starts the clock.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the time since the run started.
func (h *History) Now() time.Duration { return time.Since(h.start) }

// Add records a finished operation.
func (h *History) Add(op Op) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// Ops returns a copy of the record.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Op(nil), h.ops...)
}

// Fault is one nemesis action, with when it started and healed.
type Fault struct {
	Kind        string
	Target      string // node IDs affected
	Targets     []int  // their indexes
	Start, Stop time.Duration
}

// classify is the result of a request that answered code and err: a
// definite refusal the checkers can rely on, or an unknown outcome.
func classify(code int, err error) Result {
	switch {
	case err == nil:
		return ResOK
	case proto.CodeOf(err) == proto.CodeNoCapacity:
		return ResNoCap
	case code == http.StatusNotFound && proto.CodeOf(err) == proto.CodeNotFound:
		return ResNotFound
	case proto.CodeOf(err) == proto.CodeIllegalTransition:
		return ResAlready
	default:
		return ResUnknown
	}
}
