package proto

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sync/atomic"
	"time"
)

// MaxIDLength bounds every identifier the API accepts.
const MaxIDLength = 128

// validID reports whether s matches ^[a-z0-9][a-z0-9._-]*$ (written out:
// every ledger command checks its IDs on every replica, and the regexp
// was ~2% of a placement's CPU; FuzzValidID compares the two).
func validID(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return s != ""
}

// ValidateID checks that s is a well-formed identifier of the kind named by
// what (used in the error): 1 to MaxIDLength characters of [a-z0-9._-],
// starting with a letter or digit.
func ValidateID(what, s string) error {
	switch {
	case s == "":
		return Errorf(CodeInvalidArgument, "%s is required", what)
	case len(s) > MaxIDLength:
		return Errorf(CodeInvalidArgument, "%s is %d characters long; at most %d are allowed", what, len(s), MaxIDLength)
	case !validID(s):
		return Errorf(CodeInvalidArgument, "%s %q is not a valid identifier (lowercase letters, digits, '.', '_' and '-', starting with a letter or digit)", what, s)
	}
	return nil
}

// SlotID names slot index i of node: "<node>-s<i>".
func SlotID(node string, i int) string { return fmt.Sprintf("%s-s%d", node, i) }

// NewID returns prefix-<16 hex digits> for a ledger row the leader
// creates (allocation, claim, task): the milliseconds since the Unix
// epoch in the first 40 bits (wrapping every 34 years) and a counter of
// this process in the last 24, started at a random value. IDs made one
// after another share a long prefix and sort by creation, so the ledger's
// radix indexes add each to the last one's path (written in place within
// a transaction) instead of copying a random root-to-leaf path per row
// on every replica (docs/perf.md, round 5), and listings by ID come out
// in creation order. Two IDs of one process differ unless 2^24 are made
// within one millisecond; a new leader's IDs would equal an old one's
// only for the same millisecond and counter value (its counter starts at
// random), and the ledger refuses a duplicate ID (already_exists) rather
// than overwrite. IDs are not secrets: every route checks who may read
// or act on a row.
func NewID(prefix string) string { return ids.next(prefix, time.Now()) }

// idSource makes NewID's IDs.
type idSource struct{ n atomic.Uint64 }

var ids = newIDSource()

func newIDSource() *idSource {
	s := &idSource{}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("crypto/rand: " + err.Error())
	}
	s.n.Store(binary.BigEndian.Uint64(b[:]))
	return s
}

func (s *idSource) next(prefix string, now time.Time) string {
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(now.UnixMilli())<<24|s.n.Add(1)&(1<<24-1))
	return prefix + "-" + hex.EncodeToString(v[:])
}
