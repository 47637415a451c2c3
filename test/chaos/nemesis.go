package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
)

// The fault kinds the nemesis knows. Each starts, holds for Nemesis.Hold
// and heals (killed servers restart, paused ones continue, drops are
// removed).
const (
	KillLeader      = "kill-leader"           // kill -9 the leader
	KillFollower    = "kill-follower"         // kill -9 a follower
	KillRandom      = "kill-random"           // kill -9 any server
	PauseLeader     = "pause-leader"          // SIGSTOP the leader (longer than the election timeout)
	PauseFollower   = "pause-follower"        // SIGSTOP a follower
	IsolateLeader   = "isolate-leader"        // drop all traffic between the leader and the others; it keeps running
	IsolateFollower = "isolate-follower"      // the same for a follower
	SplitMinority   = "split-leader-minority" // the leader plus ⌊n/2⌋-1 others cut from the rest
	DropToLeader    = "drop-to-leader"        // one-way: packets from the others to the leader vanish
	DropFromLeader  = "drop-from-leader"      // one-way: packets from the leader to the others vanish
	DiskFull        = "disk-full"             // one server's data filesystem full (writes fail with ENOSPC); freed at the heal, restarted if it exited
)

// AllFaults lists every kind.
var AllFaults = []string{KillLeader, KillFollower, KillRandom, PauseLeader, PauseFollower,
	IsolateLeader, IsolateFollower, SplitMinority, DropToLeader, DropFromLeader, DiskFull}

// Nemesis injects faults into a cluster.
type Nemesis struct {
	C    *proctest.Cluster
	Net  *Net
	Disk *Disk // for disk-full
	H    *History
	Hold time.Duration
	// HoldMax, when above Hold, draws each fault's hold from [Hold, HoldMax].
	HoldMax time.Duration
	Rng     *rand.Rand
	// Log, when set, is told each fault as it starts.
	Log func(format string, args ...any)

	mu     sync.Mutex
	faults []Fault
}

// Faults returns what was injected.
func (n *Nemesis) Faults() []Fault {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Fault(nil), n.faults...)
}

// Inject runs one fault: start, hold (cut short when ctx ends), heal.
func (n *Nemesis) Inject(ctx context.Context, kind string) error {
	lctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	leader, err := n.C.Leader(lctx)
	cancel()
	if ctx.Err() != nil {
		return nil // the run ended first: not injected
	}
	if err != nil {
		return fmt.Errorf("%s: %w", kind, err)
	}
	if n.Log != nil {
		n.Log("%6.1fs nemesis: %s", n.H.Now().Seconds(), kind)
	}
	size := len(n.C.Nodes)
	follower := (leader + 1 + n.Rng.IntN(size-1)) % size
	var targets []int
	var heal func() error
	switch kind {
	case KillLeader, KillFollower, KillRandom:
		i := map[string]int{KillLeader: leader, KillFollower: follower, KillRandom: n.Rng.IntN(size)}[kind]
		targets = []int{i}
		n.C.Kill(i)
		heal = func() error { n.C.StartNode(i); return nil }
	case PauseLeader, PauseFollower:
		i := map[string]int{PauseLeader: leader, PauseFollower: follower}[kind]
		targets = []int{i}
		if err := n.C.Freeze(i); err != nil {
			return err
		}
		heal = func() error { return n.C.Thaw(i) }
	case DiskFull:
		if n.Disk == nil {
			return fmt.Errorf("%s: the rig has no fillable disks", kind)
		}
		i := n.Rng.IntN(size)
		targets = []int{i}
		filled, err := n.Disk.Fill(i)
		if err != nil {
			return err
		}
		if n.Log != nil {
			n.Log("%6.1fs nemesis: filled %s's disk (shrunk to %.1f MiB)", n.H.Now().Seconds(), n.C.Nodes[i].ID, float64(filled)/(1<<20))
		}
		heal = func() error {
			if err := n.Disk.Free(i); err != nil {
				return err
			}
			if n.C.Exited(i) {
				// Failing safe may mean exiting: restart it, as a
				// supervisor would, now that there is space again.
				if n.Log != nil {
					n.Log("%6.1fs nemesis: %s exited on the full disk; restarting it", n.H.Now().Seconds(), n.C.Nodes[i].ID)
				}
				n.C.Kill(i)
				n.C.StartNode(i)
			}
			return nil
		}
	case IsolateLeader, IsolateFollower, SplitMinority, DropToLeader, DropFromLeader:
		switch kind {
		case IsolateLeader:
			targets = []int{leader}
			err = n.Net.Isolate(ctx, leader)
		case IsolateFollower:
			targets = []int{follower}
			err = n.Net.Isolate(ctx, follower)
		case SplitMinority:
			targets = []int{leader}
			for _, j := range n.Rng.Perm(size) {
				if len(targets) < size/2 && j != leader {
					targets = append(targets, j)
				}
			}
			err = n.Net.Split(ctx, targets)
		case DropToLeader, DropFromLeader:
			targets = []int{leader}
			var ps []link
			for j := range size {
				if j != leader {
					if kind == DropToLeader {
						ps = append(ps, link{j, leader})
					} else {
						ps = append(ps, link{leader, j})
					}
				}
			}
			err = n.Net.Cut(ctx, ps...)
		}
		if err != nil && ctx.Err() != nil {
			// The run ended while the rules went in (nft killed with
			// its context): not injected; the run's end heals the net.
			return nil
		}
		if err != nil {
			return err
		}
		heal = func() error { return n.Net.Heal(context.WithoutCancel(ctx)) }
	default:
		return fmt.Errorf("unknown fault %q (known: %s)", kind, strings.Join(AllFaults, ", "))
	}
	f := Fault{Kind: kind, Targets: targets, Start: n.H.Now()}
	for _, i := range targets {
		f.Target += n.C.Nodes[i].ID
	}
	hold := n.Hold
	if n.HoldMax > hold {
		hold += time.Duration(n.Rng.Int64N(int64(n.HoldMax - hold)))
	}
	sleep(ctx, hold)
	err = heal()
	f.Stop = n.H.Now()
	n.mu.Lock()
	n.faults = append(n.faults, f)
	n.mu.Unlock()
	return err
}
