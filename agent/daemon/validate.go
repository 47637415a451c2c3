package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/gpuaas/gpuaas/agent/bootstrap"
	"github.com/gpuaas/gpuaas/proto"
)

// ValidateIBWait bounds how long a node.validate task waits for the
// InfiniBand ports to become ACTIVE.
var ValidateIBWait = 2 * time.Minute

// validateNode runs a node.validate task: the post-deploy validation
// bundle (fetched with the node credential, digest verified) and, with
// fabric_mode ib, the wait for every InfiniBand port to be ACTIVE. A
// failure carries the ports it read in its error.
func (d *Daemon) validateNode(ctx context.Context, t proto.Task) (json.RawMessage, error) {
	var p proto.NodeValidatePayload
	if err := json.Unmarshal(t.Payload, &p); err != nil {
		return nil, fmt.Errorf("task %s payload: %w", t.ID, err)
	}
	v := bootstrap.Validator{NodeID: d.cfg.NodeID, Root: d.cfg.HostRoot, WorkDir: filepath.Join(d.cfg.StateDir, "validation"),
		Runner: bootstrap.ExecRunner{}, Fetch: d.client.Bundle, IBWait: ValidateIBWait}
	res, err := v.Run(ctx, p)
	if err != nil {
		b, _ := json.Marshal(res)
		return nil, errors.Join(err, fmt.Errorf("result: %s", b))
	}
	return json.Marshal(res)
}
