package slice

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/gpuaas/gpuaas/hostops/disk"
	"github.com/gpuaas/gpuaas/proto"
)

// JournalFile is the journal's file in the agent's state directory.
const JournalFile = "slice.db"

var bucketAllocs = []byte("slice_allocations")

// Phases of an allocation record.
const (
	PhaseProvisioning = "provisioning" // a Provision is (or was, before a crash) running
	PhaseInterrupted  = "interrupted"  // Reconcile tore down an interrupted provision
	PhaseFailed       = "failed"       // Provision failed and tore its VM down
	PhaseActive       = "active"       // the VM passed the readiness gate
	PhaseReleasing    = "releasing"    // a Release is (or was) running
	PhaseReleased     = "released"     // VM gone, disks wiped (see slot proofs)
)

// SlotRecord is what the journal knows of one slot of an allocation.
type SlotRecord struct {
	SlotID   string        `json:"slot_id"`
	Identity disk.Identity `json:"identity"`
	Device   string        `json:"device,omitempty"` // resolved node, informative
	Boot     bool          `json:"boot,omitempty"`
	// Touched is set before the first byte is written to the disk (clone)
	// or a VM could write to it (start).
	Touched bool             `json:"touched,omitempty"`
	Proof   *proto.WipeProof `json:"proof,omitempty"`
	Error   string           `json:"error,omitempty"`
}

// Record is one allocation's durable runtime state.
type Record struct {
	AllocationID string       `json:"allocation_id"`
	Phase        string       `json:"phase"`
	Slots        []SlotRecord `json:"slots"`
	// Stages completed, in order (provision, then release).
	Stages     []string `json:"stages,omitempty"`
	Domain     string   `json:"domain,omitempty"`
	Defined    bool     `json:"defined,omitempty"`
	MAC        string   `json:"mac,omitempty"`
	IP         string   `json:"ip,omitempty"`
	InstanceID string   `json:"instance_id,omitempty"`
	Hostname   string   `json:"hostname,omitempty"`
	// HostKey is the guest's SSH host key the readiness gate saw, in
	// authorized_keys form: the tenant's ssh pins it (SliceAccess).
	HostKey string `json:"host_key,omitempty"`
	// PCI are the plan's GPU and fabric VF addresses (bound to vfio-pci
	// while the allocation is active, hostdevs of the domain or not).
	PCI []string `json:"pci,omitempty"`
	// GPUs are the plan's GPU host addresses by device index: the i-th is
	// pinned at GuestGPUAddr(i) in the guest (guestgpu.go).
	GPUs []string `json:"gpus,omitempty"`
	// VMStartMS is how long the hypervisor took to start the domain
	// (inside define_start): the first part of the guest's boot.
	VMStartMS int64 `json:"vm_start_ms,omitempty"`
	// LeaseBefore is the DHCP lease the boot MAC held just before the
	// domain started (leaseMark; "" = none): a lease of an earlier boot
	// of the slot, which the dhcp_lease gate must not accept.
	LeaseBefore string `json:"lease_before,omitempty"`
	// Network state applied (removed again on teardown).
	Reserved bool `json:"reserved,omitempty"`
	NATed    bool `json:"nated,omitempty"`
	Port     bool `json:"port,omitempty"`
	// AgentKey is the allocation's own agent SSH key (keys.go), made
	// before the seed authorizes it and destroyed once the slice is over.
	// A record from before per-allocation keys has none.
	AgentKey *AgentKey `json:"agent_key,omitempty"`

	Provision *proto.SliceProvisionResult `json:"provision,omitempty"`
	Release   *proto.SliceReleaseResult   `json:"release,omitempty"`
	UpdatedAt time.Time                   `json:"updated_at"`
}

// TouchedSlots lists the slots whose disks were touched and not wiped.
func (r Record) TouchedSlots() []string {
	var out []string
	for _, s := range r.Slots {
		if s.Touched && s.Proof == nil {
			out = append(out, s.SlotID)
		}
	}
	return out
}

func (r Record) slot(id string) *SlotRecord {
	for i := range r.Slots {
		if r.Slots[i].SlotID == id {
			return &r.Slots[i]
		}
	}
	return nil
}

// Journal is the bbolt store of allocation records.
type Journal struct {
	db *bolt.DB
}

// JournalMode is the journal file's mode: it holds the allocations'
// private agent keys.
const JournalMode os.FileMode = 0o600

// OpenJournal opens (creating) dir/slice.db. A journal file readable by
// others (made by an older agent, or copied) is restricted to JournalMode
// before it is used.
func OpenJournal(dir string) (*Journal, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("slice journal: %w", err)
	}
	path := filepath.Join(dir, JournalFile)
	db, err := bolt.Open(path, JournalMode, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open slice journal in %s: %w", dir, err)
	}
	if err := restrictMode(path); err != nil {
		db.Close()
		return nil, err
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucketAllocs)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("slice journal: %w", err)
	}
	return &Journal{db: db}, nil
}

// Close closes the store.
func (j *Journal) Close() error { return j.db.Close() }

// Get returns the allocation's record.
func (j *Journal) Get(alloc string) (Record, bool, error) {
	var rec Record
	var ok bool
	err := j.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketAllocs).Get([]byte(alloc))
		if v == nil {
			return nil
		}
		ok = true
		return json.Unmarshal(v, &rec)
	})
	if err != nil {
		return Record{}, false, fmt.Errorf("slice journal: read %s: %w", alloc, err)
	}
	return rec, ok, nil
}

// Put writes the record (fsynced before it returns).
func (j *Journal) Put(rec Record) error {
	if rec.AllocationID == "" {
		return errors.New("slice journal: record without allocation ID")
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := j.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketAllocs).Put([]byte(rec.AllocationID), b) }); err != nil {
		return fmt.Errorf("slice journal: write %s: %w", rec.AllocationID, err)
	}
	return nil
}

// List returns every record, sorted by allocation ID.
func (j *Journal) List() ([]Record, error) {
	var out []Record
	err := j.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketAllocs).ForEach(func(k, v []byte) error {
			var r Record
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("record %s: %w", k, err)
			}
			out = append(out, r)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("slice journal: list: %w", err)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].AllocationID < out[b].AllocationID })
	return out, nil
}

// Delete removes a record.
func (j *Journal) Delete(alloc string) error {
	return j.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketAllocs).Delete([]byte(alloc)) })
}

// restrictMode makes path JournalMode if it grants more.
func restrictMode(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("slice journal: %w", err)
	}
	if st.Mode().Perm()&^JournalMode == 0 {
		return nil
	}
	if err := os.Chmod(path, JournalMode); err != nil {
		return fmt.Errorf("slice journal %s has mode %v and cannot be restricted to %v: %w", path, st.Mode().Perm(), JournalMode, err)
	}
	return nil
}
