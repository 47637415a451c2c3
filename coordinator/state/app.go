package state

import (
	"github.com/hashicorp/go-memdb"

	"github.com/gpuaas/gpuaas/proto"
)

// TableApps is the app catalog (by name + version).
const TableApps = "apps"

func addAppTables(add func(*memdb.TableSchema)) {
	add(table(TableApps,
		idx(idxID, true, false, func(b []byte, o *proto.App) ([]byte, bool) { return str(str(b, o.Name), o.Version), true })))
}

// Apps returns the app catalog sorted by name then version (the versions
// of one app when name is set).
func (s *Snapshot) Apps(name string) []*proto.App {
	if name == "" {
		return list[proto.App](s, TableApps, idxID)
	}
	return list[proto.App](s, TableApps, idxID+"_prefix", name)
}

// App returns version of app name.
func (s *Snapshot) App(name, version string) (*proto.App, bool) {
	return first[proto.App](s, TableApps, idxID, name, version)
}

// PutApp writes an app catalog entry.
func (t *Txn) PutApp(o *proto.App) error {
	old, ok := t.App(o.Name, o.Version)
	t.stamp(TableApps, &o.Meta, metaOf(old, ok, func(x *proto.App) *proto.Meta { return &x.Meta }))
	return t.insert(TableApps, prior(old, ok), o)
}
