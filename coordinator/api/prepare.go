package api

import (
	"encoding/json"
	"log/slog"
	"net/http"

	"github.com/gpuaas/gpuaas/proto"
)

// queuePrepareSlice queues host.prepare_slice for a node's agent (POST
// /v1/nodes/{id}/prepare-slice, admin). The optional body is a
// proto.HostPrepareSlicePayload; blank fields take the agent's configured
// values, and the agent validates every field before it changes anything.
func (a *API) queuePrepareSlice(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	nodeID, err := c.pathID("id", "node id")
	if err != nil {
		return err
	}
	var body proto.HostPrepareSlicePayload
	if err := c.decode(&body, true); err != nil {
		return err
	}
	if body.VFsPerPF < 0 || body.VFsPerPF > 256 || len(body.FabricPFs) > 16 {
		return proto.Errorf(proto.CodeInvalidArgument, "vfs_per_pf must be 0-256 and fabric_pfs at most 16 addresses")
	}
	if _, ok := a.b.Store().Snapshot().Node(nodeID); !ok {
		return proto.Errorf(proto.CodeNotFound, "node %s not found", nodeID)
	}
	payload, err := json.Marshal(body)
	if err != nil {
		return err
	}
	now := a.now()
	t := proto.Task{ID: proto.NewID("task"), NodeID: nodeID, Type: proto.TaskHostPrepareSlice, State: proto.TaskQueued, CreatedAt: now, Payload: payload}
	resp, idx, err := a.b.Apply(c.r.Context(), proto.TaskCreateType, proto.TaskCreateRequest{At: now, Task: t})
	if err != nil {
		return err
	}
	c.index = idx
	return c.reply(http.StatusAccepted, resp)
}

// requeuePrepareOnDrift queues host.prepare_slice (with the agent's
// configured values) when a slice_vm node that was slice-ready reports
// blockers, unless one is already queued or running. It returns the Raft
// index of the new task (0 when none was queued).
func (a *API) requeuePrepareOnDrift(c *call, nodeID string, blockers []string) (uint64, error) {
	snap := a.b.Store().Snapshot()
	n, ok := snap.Node(nodeID)
	if !ok || n.ProfileIntent != proto.IntentSliceVM {
		return 0, nil
	}
	for _, t := range snap.Tasks(nodeID, "", "", 0) {
		if t.Type == proto.TaskHostPrepareSlice && (t.State == proto.TaskQueued || t.State == proto.TaskRunning) {
			return 0, nil
		}
	}
	now := a.now()
	t := proto.Task{ID: proto.NewID("task"), NodeID: nodeID, Type: proto.TaskHostPrepareSlice, State: proto.TaskQueued, CreatedAt: now, Payload: json.RawMessage("{}")}
	_, idx, err := a.b.Apply(c.r.Context(), proto.TaskCreateType, proto.TaskCreateRequest{At: now, Task: t})
	if err != nil {
		return 0, err
	}
	slog.Warn("slice readiness drifted: host.prepare_slice queued", "node", nodeID, "task", t.ID, "blockers", blockers)
	return idx, nil
}

// approveDiskOwnership records an operator's approval of destructive slice
// ownership of a convertible disk (POST /v1/nodes/{id}/disks/ownership,
// admin) and answers with the node's topology.
func (a *API) approveDiskOwnership(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	nodeID, err := c.pathID("id", "node id")
	if err != nil {
		return err
	}
	var body proto.DiskOwnershipBody
	if err := c.decode(&body, false); err != nil {
		return err
	}
	for _, f := range []string{body.Serial, body.WWN, body.EUI} {
		if len(f) > 128 {
			return proto.Errorf(proto.CodeInvalidArgument, "disk identity fields are at most 128 characters")
		}
	}
	req := proto.DiskOwnershipApproveRequest{At: now(), NodeID: nodeID, Disk: proto.DiskIdentity{Serial: body.Serial, WWN: body.WWN, EUI: body.EUI},
		By: c.p.Name, Reason: body.Reason}
	if err := c.apply(proto.DiskOwnershipApproveType, req); err != nil {
		return err
	}
	topo, ok := a.b.Store().Snapshot().Candidates(nodeID)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "node %s has no discovered topology", nodeID)
	}
	return c.reply(http.StatusOK, topo)
}
