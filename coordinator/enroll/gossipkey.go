package enroll

import (
	"slices"

	"github.com/gpuaas/gpuaas/proto"
)

// GossipKeyring returns the cluster's gossip keyring (Version 0: none yet).
func (t *Table) GossipKeyring() proto.GossipKeyring {
	t.mu.RLock()
	defer t.mu.RUnlock()
	k := t.gossip
	k.Keys = slices.Clone(k.Keys)
	return k
}

// GossipKeyringOp applies one keyring operation (Consul's keyring model):
//   - install adds a key (a no-op when present; the first key installed
//     into an empty keyring becomes primary);
//   - use makes an installed key primary;
//   - remove drops a key that is not primary;
//   - seed installs the key as primary only when the keyring is empty
//     (a no-op otherwise).
//
// A refused operation changes nothing. The keyring's Version increases
// with every change.
func (t *Table) GossipKeyringOp(req proto.GossipKeyringOpRequest) (proto.GossipKeyring, error) {
	if _, err := proto.DecodeGossipKey(req.Key); err != nil {
		return proto.GossipKeyring{}, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	k := &t.gossip
	has := slices.Contains(k.Keys, req.Key)
	changed := false
	switch req.Op {
	case proto.GossipKeySeed:
		if len(k.Keys) == 0 {
			k.Keys, k.Primary, changed = []string{req.Key}, req.Key, true
		}
	case proto.GossipKeyInstall:
		if !has {
			if len(k.Keys) >= proto.MaxGossipKeys {
				return t.gossipCopy(), proto.Errorf(proto.CodeConflict, "the gossip keyring holds %d keys already; remove one first", len(k.Keys))
			}
			k.Keys = append(k.Keys, req.Key)
			if k.Primary == "" {
				k.Primary = req.Key
			}
			changed = true
		}
	case proto.GossipKeyUse:
		if !has {
			return t.gossipCopy(), proto.Errorf(proto.CodeConflict, "gossip key %s is not installed; install it first", Fingerprint(req.Key))
		}
		if k.Primary != req.Key {
			k.Primary, changed = req.Key, true
		}
	case proto.GossipKeyRemove:
		if !has {
			return t.gossipCopy(), proto.Errorf(proto.CodeNotFound, "gossip key %s is not installed", Fingerprint(req.Key))
		}
		if k.Primary == req.Key {
			return t.gossipCopy(), proto.Errorf(proto.CodeConflict, "gossip key %s is the primary key; use another key first", Fingerprint(req.Key))
		}
		k.Keys = slices.DeleteFunc(k.Keys, func(s string) bool { return s == req.Key })
		changed = true
	default:
		return t.gossipCopy(), proto.Errorf(proto.CodeInvalidArgument, "gossip keyring op %q: want install, use or remove", req.Op)
	}
	if changed {
		// Primary first, then the others in install order.
		rest := slices.DeleteFunc(slices.Clone(k.Keys), func(s string) bool { return s == k.Primary })
		k.Keys = append([]string{k.Primary}, rest...)
		k.Version++
	}
	return t.gossipCopy(), nil
}

func (t *Table) gossipCopy() proto.GossipKeyring {
	k := t.gossip
	k.Keys = slices.Clone(k.Keys)
	return k
}

// Fingerprint names a gossip key in messages and logs without revealing
// it: the first 8 hex digits of its SHA-256.
func Fingerprint(key string) string { return Hash(key)[:8] }
