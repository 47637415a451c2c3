package state

import (
	"github.com/hashicorp/go-memdb"

	"github.com/gpuaas/gpuaas/proto"
)

// TableBundles holds the published bootstrap, commissioning and
// post-deploy validation bundles, by digest (content-addressed): every
// replica holds every bundle's bytes.
const TableBundles = "bundles"

func addBundleTables(add func(*memdb.TableSchema)) {
	add(table(TableBundles,
		idx(idxID, true, false, byString(func(o *proto.Bundle) string { return o.Digest }, false))))
}

// Bundles returns every bundle sorted by digest (with content: callers
// that list them drop it).
func (s *Snapshot) Bundles() []*proto.Bundle { return list[proto.Bundle](s, TableBundles, idxID) }

// Bundle returns the bundle with digest.
func (s *Snapshot) Bundle(digest string) (*proto.Bundle, bool) {
	return byID[proto.Bundle](s, TableBundles, digest)
}

// PutBundle writes a bundle.
func (t *Txn) PutBundle(o *proto.Bundle) error {
	old, ok := t.Bundle(o.Digest)
	t.stamp(TableBundles, &o.Meta, metaOf(old, ok, func(x *proto.Bundle) *proto.Meta { return &x.Meta }))
	return t.insert(TableBundles, prior(old, ok), o)
}
