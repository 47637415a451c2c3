package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/lab/maaslab"
	"github.com/gpuaas/gpuaas/proto"
)

// onboardMAAS onboards, as one batch through the MAAS simulator, every
// host whose agent holds no credential yet (hosts enrolled in an earlier
// run start their agent directly), and waits for the workflows. viaMAAS
// gets each onboarded host's gpuaas-bootstrap pid (the agent's parent).
func onboardMAAS(ctx context.Context, log *slog.Logger, api fleet.API, ml *maaslab.Lab, hosts []fleet.Host, viaMAAS map[string]int) ([]proto.WorkflowView, error) {
	if err := ml.Setup(ctx, api); err != nil {
		return nil, err
	}
	var pending []fleet.Host
	for _, h := range hosts {
		if _, err := fleet.EnsureRoot(h); err != nil {
			return nil, err
		}
		if !fleet.Enrolled(h) {
			pending = append(pending, h)
			viaMAAS[h.Name] = 0
		}
	}
	if len(pending) == 0 {
		return nil, nil
	}
	ids, err := ml.Onboard(ctx, api, pending)
	if err != nil {
		return nil, err
	}
	log.Info("onboarding through the MAAS simulator", "maas", ml.URL, "workflows", ids)
	views, err := ml.Wait(ctx, api, ids)
	if err != nil {
		return views, err
	}
	for _, h := range pending {
		if p := ml.Bootstrap(h.Name); p != nil {
			viaMAAS[h.Name] = p.Pid()
		}
	}
	for _, v := range views {
		log.Info("onboarded through MAAS", "host", v.Hostname, "workflow", v.ID, "seconds", fmt.Sprintf("%.1f", v.TotalSeconds))
	}
	return views, nil
}

// withoutNodes drops the nodes of an inventory (MAAS onboarding brings them).
func withoutNodes(inv []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(inv, &m); err != nil {
		return nil, fmt.Errorf("lab inventory: %w", err)
	}
	delete(m, "nodes")
	return json.MarshalIndent(m, "", "  ")
}

// ensureSiteKey keeps the coordinators' site key (sealing the MAAS
// credentials) in the lab folder, 0600.
func ensureSiteKey(dir string) (string, error) {
	return ensureSecretFile(filepath.Join(dir, "site.key"))
}

// ensureClusterSecret makes the secret the lab's coordinators share for
// cluster formation (-cluster-secret-file), once.
func ensureClusterSecret(dir string) (string, error) {
	return ensureSecretFile(filepath.Join(dir, "cluster.secret"))
}

// ensureSecretFile writes 32 random bytes as hex to path (0600) unless
// it exists.
func ensureSecretFile(path string) (string, error) {
	if _, err := os.Stat(path); err == nil {
		return path, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	var k [32]byte
	if _, err := rand.Read(k[:]); err != nil {
		return "", err
	}
	return path, atomicfile.WriteFile(path, []byte(hex.EncodeToString(k[:])+"\n"), 0o600)
}

// printWorkflows shows each MAAS onboarding's timeline: where the time went.
func printWorkflows(out io.Writer, flows []proto.WorkflowView) {
	if len(flows) == 0 {
		return
	}
	fmt.Fprintf(out, "\nMAAS onboarding (simulated region, real gpuaas-bootstrap; bin/gpuaasctl workflow show ID):\n\n")
	for _, w := range flows {
		var parts []string
		for _, b := range w.Timeline {
			if b.Measured {
				parts = append(parts, fmt.Sprintf("%s %.2fs", b.Bucket, b.DurationSeconds))
			}
		}
		fmt.Fprintf(out, "  %-7s %-28s %s in %.1fs\n          %s\n", w.Hostname, w.ID, w.State, w.TotalSeconds, strings.Join(parts, ", "))
	}
}
