package state

import (
	"github.com/hashicorp/go-memdb"

	"github.com/gpuaas/gpuaas/proto"
)

// TableImages is the image catalog (by name + version).
const TableImages = "images"

func addImageTables(add func(*memdb.TableSchema)) {
	add(table(TableImages,
		idx(idxID, true, false, func(b []byte, o *proto.Image) ([]byte, bool) { return str(str(b, o.Name), o.Version), true })))
}

// Images returns the catalog sorted by name then version (the versions
// of one image when name is set).
func (s *Snapshot) Images(name string) []*proto.Image {
	if name == "" {
		return list[proto.Image](s, TableImages, idxID)
	}
	return list[proto.Image](s, TableImages, idxID+"_prefix", name)
}

// Image returns version of image name.
func (s *Snapshot) Image(name, version string) (*proto.Image, bool) {
	return first[proto.Image](s, TableImages, idxID, name, version)
}

// PutImage writes a catalog entry.
func (t *Txn) PutImage(o *proto.Image) error {
	old, ok := t.Image(o.Name, o.Version)
	t.stamp(TableImages, &o.Meta, metaOf(old, ok, func(x *proto.Image) *proto.Meta { return &x.Meta }))
	return t.insert(TableImages, prior(old, ok), o)
}
