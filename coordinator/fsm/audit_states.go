package fsm

import (
	"encoding/json"
	"strings"

	"github.com/gpuaas/gpuaas/proto"
)

// auditStateCache remembers the rendered audit state (proto.AuditState)
// of stored allocations by identity. A stored object is immutable (a
// write stores a new object), so its rendering never changes: the
// release record's "before" is most often the very allocation the
// placement record rendered as "after", and is copied instead of
// encoded again — and the two records share the bytes on the heap.
//
// A hit and a miss give the same bytes (the rendering is a function of
// the object's content alone), so what the cache holds — another
// replica's cache, or an empty one after a restore — never changes a
// record or its hash. The cache holds at most 2×auditCacheGen entries
// (two generations: the current one is moved to the old one when full,
// and the old one dropped), and keeps the objects it names alive.
type auditStateCache struct {
	cur, old map[*proto.Allocation]json.RawMessage
}

// auditCacheGen is the size of a generation: a release seen within
// ~1,000 audited allocation writes of its placement hits.
const auditCacheGen = 1024

// state returns a's rendering, from the cache or rendered (and kept).
func (c *auditStateCache) state(a *proto.Allocation) json.RawMessage {
	if b, ok := c.cur[a]; ok {
		return b
	}
	b, ok := c.old[a]
	if !ok {
		b = proto.AuditState(a)
	}
	if c.cur == nil || len(c.cur) >= auditCacheGen {
		c.old, c.cur = c.cur, make(map[*proto.Allocation]json.RawMessage, auditCacheGen)
	}
	c.cur[a] = b
	return b
}

// reset forgets everything (a restore: the objects belong to the old
// store).
func (c *auditStateCache) reset() { c.cur, c.old = nil, nil }

// packAuditStrings moves the text fields of a record about to be stored
// into one allocation: the log keeps every record (until an exported
// prefix is pruned) and each garbage collection marks what it holds, so
// one string object instead of a dozen decoded ones (actor, route, path,
// request id, ..., the hash) is less work for each. The values do not
// change; strings already shared with the ledger (slot ids) stay as
// they are.
func packAuditStrings(r *proto.AuditRecord) {
	fields := [...]*string{&r.Actor, &r.Role, &r.TokenID, &r.Remote, &r.RequestID, &r.Method, &r.Route, &r.Path,
		&r.ObjectKind, &r.ObjectID, &r.Reason, &r.Error, &r.Hash}
	n := 0
	for _, f := range fields {
		n += len(*f)
	}
	var b strings.Builder
	b.Grow(n)
	for _, f := range fields {
		b.WriteString(*f)
	}
	all := b.String()
	for _, f := range fields {
		k := len(*f)
		*f, all = all[:k], all[k:]
	}
}
