package slice

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/proto"
)

// Per-allocation agent keys.
//
// Every allocation gets its own ed25519 key, made before its seed is
// written: the seed authorizes its public key (beside the tenant's keys)
// and the readiness gate and Reconcile's guest probe log in with it. A key
// therefore opens exactly one guest, and is destroyed when that guest's
// slice is over (the VM gone, the disks wiped), so a leaked agent key can
// never reach another tenant's slice or a re-used disk.
//
// The private key lives in the allocation's journal Record (AgentKey), not
// in a file of its own:
//   - it is written in the same fsynced bbolt transaction as the record that
//     names the guest's address and instance-id, so no crash can leave a
//     seed authorizing a key the agent lost (or a key file without a
//     record to clean it up);
//   - destroying it is one field cleared in the same write that records
//     the release, instead of a second file to remove and reconcile;
//   - the journal file is 0600 in the agent's 0700 state directory
//     (OpenJournal enforces the mode), while the allocation's directory
//     under StateDir is 0755 and QEMU-reachable (seed ISO, NVRAM): a key
//     file there would sit next to what the hypervisor user reads.
//
// A record written before per-allocation keys has no AgentKey: its guest
// was seeded with the agent-wide key, which Deps.AgentKey still holds, so
// upgrading an agent does not make live slices look unreachable.

// AgentKey is an allocation's agent SSH key as the journal keeps it.
type AgentKey struct {
	// Private is the OpenSSH PEM private key.
	Private string `json:"private"`
	// Public is its authorized_keys line ("ssh-ed25519 AAAA... gpuaas-agent <allocation>").
	Public string `json:"public"`
	// Generation names the slot claims it was made for (see
	// keyGeneration): a re-run of the same allocation and generation
	// reuses it, a new generation gets a fresh key.
	Generation string    `json:"generation"`
	CreatedAt  time.Time `json:"created_at"`
}

// KeyComment is the authorized_keys comment of an allocation's agent key.
func KeyComment(alloc string) string { return "gpuaas-agent " + alloc }

// NewAgentKey makes a fresh ed25519 key for alloc.
func NewAgentKey(alloc, generation string, now time.Time) (*AgentKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("agent key of %s: %w", alloc, err)
	}
	block, err := ssh.MarshalPrivateKey(priv, KeyComment(alloc))
	if err != nil {
		return nil, fmt.Errorf("agent key of %s: %w", alloc, err)
	}
	pk, err := ssh.NewPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("agent key of %s: %w", alloc, err)
	}
	return &AgentKey{Private: string(pem.EncodeToMemory(block)),
		Public:     strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pk))) + " " + KeyComment(alloc),
		Generation: generation, CreatedAt: now.UTC()}, nil
}

// Signer parses the private key.
func (k *AgentKey) Signer() (ssh.Signer, error) {
	if k == nil {
		return nil, errors.New("no agent key")
	}
	s, err := ssh.ParsePrivateKey([]byte(k.Private))
	if err != nil {
		return nil, fmt.Errorf("parse agent key: %w", err)
	}
	return s, nil
}

// keyGeneration names the slot claims of a request ("slot@generation",
// sorted): the same allocation on the same claims keeps its key.
func keyGeneration(slots []proto.Slot) string {
	var parts []string
	for _, s := range slots {
		parts = append(parts, s.ID+"@"+strconv.FormatUint(s.Generation, 10))
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// Key sources of a guest login (GuestProbe.Key).
const (
	KeyAllocation = "allocation" // the allocation's own key (AgentKey of its record)
	KeyAgent      = "agent"      // the agent-wide key: a record from before per-allocation keys
)

// guestKey returns the signer that reaches rec's guest: the allocation's
// key, or the agent-wide one for a record from before per-allocation keys.
func (r *Runtime) guestKey(rec *Record) (ssh.Signer, string, error) {
	if rec.AgentKey != nil {
		s, err := rec.AgentKey.Signer()
		if err != nil {
			return nil, "", fmt.Errorf("allocation %s: %w", rec.AllocationID, err)
		}
		return s, KeyAllocation, nil
	}
	if r.d.AgentKey != nil {
		return r.d.AgentKey, KeyAgent, nil
	}
	return nil, "", fmt.Errorf("allocation %s: no agent key in its record and no agent-wide key", rec.AllocationID)
}

// ensureKey gives rec a key for the request's generation (reusing the one
// it has) and persists it before the seed authorizes it.
func (r *Runtime) ensureKey(rec *Record, req ProvisionRequest) error {
	gen := keyGeneration(req.Slots)
	if rec.AgentKey != nil && rec.AgentKey.Generation == gen {
		if _, err := rec.AgentKey.Signer(); err == nil {
			return nil
		}
	}
	k, err := NewAgentKey(req.AllocationID, gen, r.d.Now())
	if err != nil {
		return err
	}
	rec.AgentKey = k
	return r.put(rec)
}

// destroyKey forgets rec's agent key (the caller writes the record). It
// is called once nothing may log in to the allocation's guest again: the
// VM is gone and, on release and cleanup, its disks were wiped.
func (r *Runtime) destroyKey(rec *Record, why string) {
	if rec.AgentKey == nil {
		return
	}
	fp := ""
	if s, err := rec.AgentKey.Signer(); err == nil {
		fp = ssh.FingerprintSHA256(s.PublicKey())
	}
	rec.AgentKey = nil
	r.d.Log.Info("allocation SSH key destroyed", "allocation", rec.AllocationID, "fingerprint", fp, "why", why)
}

// keyNeeded reports whether a record in this phase may still need its
// guest key: an active guest is probed, a running provision or release
// still owns it, and an interrupted provision of a live allocation is
// re-delivered (and reuses the key).
func keyNeeded(phase string, live bool) bool {
	switch phase {
	case PhaseActive, PhaseProvisioning, PhaseReleasing:
		return true
	case PhaseInterrupted:
		return live
	}
	return false
}

// ErrNoGuest is GuestKey's error for an allocation whose guest is gone
// (or never was on this host): there is nothing to log in to.
var ErrNoGuest = errors.New("no guest")

// GuestKey returns the signer that opens allocation alloc's guest: the app
// runner's channel into a slice (agent/apprun: SSH with the allocation's
// own key, the one its seed authorizes). It fails with ErrNoGuest for an
// allocation this agent has no record of or whose slice is over.
func (r *Runtime) GuestKey(alloc string) (ssh.Signer, error) {
	rec, ok, err := r.d.Journal.Get(alloc)
	if err != nil {
		return nil, fmt.Errorf("allocation %s: %w", alloc, err)
	}
	if !ok {
		return nil, fmt.Errorf("allocation %s: %w: no slice of it on this host", alloc, ErrNoGuest)
	}
	if !keyNeeded(rec.Phase, true) {
		return nil, fmt.Errorf("allocation %s: %w: its slice is %s", alloc, ErrNoGuest, rec.Phase)
	}
	s, _, err := r.guestKey(&rec)
	return s, err
}
