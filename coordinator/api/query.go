package api

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/metrics"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Query parameters every read accepts besides its own filters.
var (
	readParams     = []string{"consistent", "stale", "min_index"}
	blockingParams = []string{"index", "wait"}
	pagingParams   = []string{"limit", "after"}
	errWaitNoIdx   = proto.Errorf(proto.CodeInvalidArgument, "wait is only meaningful with index")
	waitUnitsHelp  = "a duration such as 500ms, 30s or 5m"
)

// query checks that only allowed parameters are present, each at most
// once, and returns them. Every GET also takes ?min_index (freshness.go):
// a route that does not handle it itself (read does) has it honoured
// here, before it reads anything.
func (c *call) query(allowed ...string) (url.Values, error) {
	q := c.r.URL.Query()
	if c.r.Method == http.MethodGet && q.Has("min_index") && !slices.Contains(allowed, "min_index") {
		if len(q["min_index"]) > 1 {
			return nil, proto.Errorf(proto.CodeInvalidArgument, "query parameter %q is given %d times", "min_index", len(q["min_index"]))
		}
		f, err := parseFreshness(url.Values{"min_index": q["min_index"]}, false)
		if err != nil {
			return nil, err
		}
		f.stale = true // the catch-up check is read's, for the routes that read the ledger through it
		if err := c.fresh(c.r.Context(), f); err != nil {
			return nil, err
		}
		q.Del("min_index")
	}
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !slices.Contains(allowed, k) {
			if len(allowed) == 0 {
				return nil, proto.Errorf(proto.CodeInvalidArgument, "unknown query parameter %q; this route takes none", k)
			}
			return nil, proto.Errorf(proto.CodeInvalidArgument, "unknown query parameter %q; allowed: %s", k, strings.Join(allowed, ", "))
		}
		if len(q[k]) > 1 {
			return nil, proto.Errorf(proto.CodeInvalidArgument, "query parameter %q is given %d times", k, len(q[k]))
		}
	}
	return q, nil
}

// idParam returns an optional identifier filter.
func idParam(q url.Values, name string) (string, error) {
	v := q.Get(name)
	if v == "" {
		return "", nil
	}
	return v, proto.ValidateID(name, v)
}

func boolParam(q url.Values, name string) (bool, error) {
	v := q.Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, proto.Errorf(proto.CodeInvalidArgument, "%s=%q is not a boolean (true or false)", name, v)
	}
	return b, nil
}

// page is a validated ?limit&after.
type page struct {
	limit int
	after string
}

func pageParams(q url.Values) (page, error) {
	p := page{limit: proto.DefaultPageLimit, after: q.Get("after")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > proto.MaxPageLimit {
			return p, proto.Errorf(proto.CodeInvalidArgument, "limit=%q must be an integer from 1 to %d", v, proto.MaxPageLimit)
		}
		p.limit = n
	}
	// The longest cursor is an image's name:version.
	if len(p.after) > 2*proto.MaxIDLength+1 {
		return p, proto.Errorf(proto.CodeInvalidArgument, "after is over %d characters", 2*proto.MaxIDLength+1)
	}
	return p, nil
}

// cut pages items (sorted by key) after p.after, returning the page and
// the cursor of the next one.
func cut[T any](items []T, key func(T) string, p page) ([]T, string) {
	start := 0
	if p.after != "" {
		start, _ = slices.BinarySearchFunc(items, p.after, func(it T, k string) int { return strings.Compare(key(it), k) })
		for start < len(items) && key(items[start]) <= p.after {
			start++
		}
	}
	items = items[start:]
	if len(items) > p.limit {
		return items[:p.limit], key(items[p.limit-1])
	}
	return items, ""
}

// blocking is a validated ?index&wait.
type blocking struct {
	index uint64
	wait  time.Duration
}

func parseBlocking(q url.Values) (blocking, error) {
	var b blocking
	iv, wv := q.Get("index"), q.Get("wait")
	if iv == "" {
		if wv != "" {
			return b, errWaitNoIdx
		}
		return b, nil
	}
	n, err := strconv.ParseUint(iv, 10, 64)
	if err != nil {
		return b, proto.Errorf(proto.CodeInvalidArgument, "index=%q is not a non-negative integer", iv)
	}
	b.index = n
	b.wait = proto.DefaultBlockingWait
	if wv != "" {
		d, err := time.ParseDuration(wv)
		if err != nil || d <= 0 {
			return b, proto.Errorf(proto.CodeInvalidArgument, "wait=%q is not a positive duration (%s)", wv, waitUnitsHelp)
		}
		b.wait = min(d, proto.MaxBlockingWait)
	}
	return b, nil
}

// readOpts are the common options of a read route.
type readOpts struct {
	tables  []string // what the route reads: its index and what it blocks on
	block   bool     // route accepts ?index&wait
	paging  bool     // route accepts ?limit&after
	filters []string // route-specific parameters
	// replica: the route describes this replica itself (status): it is
	// always answered locally, caught up or not.
	replica bool
}

// read parses the common parameters, honours ?consistent and ?index,
// takes a snapshot and calls fn with it, the parsed query and the page;
// fn's value is written as 200 JSON.
func (c *call) read(o readOpts, fn func(s *state.Snapshot, q url.Values, p page) (any, error)) error {
	allowed := append(append([]string(nil), readParams...), o.filters...)
	if o.block {
		allowed = append(allowed, blockingParams...)
	}
	if o.paging {
		allowed = append(allowed, pagingParams...)
	}
	q, err := c.query(allowed...)
	if err != nil {
		return err
	}
	consistent, err := boolParam(q, "consistent")
	if err != nil {
		return err
	}
	var bl blocking
	if o.block {
		if bl, err = parseBlocking(q); err != nil {
			return err
		}
	}
	var pg page
	if o.paging {
		if pg, err = pageParams(q); err != nil {
			return err
		}
	}
	fr, err := parseFreshness(q, consistent)
	if err != nil {
		return err
	}
	if o.replica || consistent {
		// Status describes this replica; a consistent read's barrier
		// has caught it up already.
		fr.stale = true
	}
	ctx := c.r.Context()
	if consistent && !staleConsistentReads {
		if err := c.a.b.Barrier(ctx); err != nil {
			return err
		}
	} else {
		c.local = true
	}
	if err := c.fresh(ctx, fr); err != nil {
		return err
	}
	if bl.index > 0 {
		if err := c.wait(ctx, bl, o.tables); err != nil {
			return err
		}
	}
	snap := c.a.b.Store().Snapshot()
	c.index = tablesIndex(snap, o.tables)
	v, err := fn(snap, q, pg)
	if err != nil {
		return err
	}
	return c.reply(200, v)
}

// wait blocks until one of tables moves past bl.index or bl.wait passes
// (with up to 1/16 jitter so watchers do not wake together). Timing out
// is not an error: the caller answers with the current state.
func (c *call) wait(ctx context.Context, bl blocking, tables []string) error {
	// Jitter never takes the wait past the route's deadline: answer
	// (with the current state) a little before it.
	d := min(bl.wait+rand.N(bl.wait/16+1), remaining(ctx)-blockingAnswerMargin)
	if d <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	defer c.a.metrics.LongPoll(metrics.LongPollQuery)()
	for {
		_, err := c.a.b.Store().Wait(ctx, bl.index, tables...)
		switch {
		case err == nil, errors.Is(err, context.DeadlineExceeded):
			return nil
		case errors.Is(err, state.ErrAbandoned):
			continue // a snapshot restore swapped the store: wait on the new one
		case ctx.Err() != nil:
			return nil // the client went away
		default:
			return err
		}
	}
}

// tablesIndex is the index a read reports: the largest index of the
// tables it read, and at least 1, so a watcher of a table never written
// still blocks (?index=0 answers at once) instead of spinning.
func tablesIndex(s *state.Snapshot, tables []string) uint64 {
	var m uint64 = 1
	if len(tables) == 0 {
		return max(m, s.Index())
	}
	for _, t := range tables {
		m = max(m, s.TableIndex(t))
	}
	return m
}
