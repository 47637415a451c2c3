package state

import (
	"github.com/hashicorp/go-memdb"

	"github.com/gpuaas/gpuaas/proto"
)

// TableAppInstances holds app instances (by allocation + app name: one
// instance per app per allocation; a relaunch replaces a stopped or
// failed one).
const TableAppInstances = "app_instances"

func addAppInstanceTables(add func(*memdb.TableSchema)) {
	add(table(TableAppInstances,
		idx(idxID, true, false, func(b []byte, o *proto.AppInstance) ([]byte, bool) {
			return str(str(b, o.AllocationID), o.App), true
		})))
}

// AppInstances returns the app instances of an allocation ("" = all),
// sorted by allocation then app name.
func (s *Snapshot) AppInstances(alloc string) []*proto.AppInstance {
	if alloc == "" {
		return list[proto.AppInstance](s, TableAppInstances, idxID)
	}
	return list[proto.AppInstance](s, TableAppInstances, idxID+"_prefix", alloc)
}

// AppInstance returns the instance of app on alloc.
func (s *Snapshot) AppInstance(alloc, app string) (*proto.AppInstance, bool) {
	return first[proto.AppInstance](s, TableAppInstances, idxID, alloc, app)
}

// PutAppInstance writes an app instance.
func (t *Txn) PutAppInstance(o *proto.AppInstance) error {
	old, ok := t.AppInstance(o.AllocationID, o.App)
	t.stamp(TableAppInstances, &o.Meta, metaOf(old, ok, func(x *proto.AppInstance) *proto.Meta { return &x.Meta }))
	return t.insert(TableAppInstances, prior(old, ok), o)
}
