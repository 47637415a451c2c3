package iradix

import (
	"fmt"
	"testing"
)

// TestWithoutWatchChannels: non-tracking transactions make nodes without
// channels and still read and write correctly; a tracking transaction over
// them still makes (and closes) channels and never closes a nil one.
func TestWithoutWatchChannels(t *testing.T) {
	noWatch = true
	defer func() { noWatch = false }()
	r := New()
	txn := r.Txn()
	for i := 0; i < 20000; i++ {
		txn.Insert([]byte(fmt.Sprintf("k%05d", i)), i)
	}
	r = txn.Commit()
	if r.Len() != 20000 {
		t.Fatalf("len %d", r.Len())
	}
	ch, v, ok := r.Root().GetWatch([]byte("k00042"))
	if !ok || v.(int) != 42 || ch != nil {
		t.Fatalf("get: %v %v %v", ch, v, ok)
	}
	txn = r.Txn()
	txn.TrackMutate(true)
	txn.Insert([]byte("k00042"), -1)
	txn.Delete([]byte("k00043"))
	r2 := txn.Commit() // closes only the channels that exist
	ch, v, _ = r2.Root().GetWatch([]byte("k00042"))
	if v.(int) != -1 || ch == nil {
		t.Fatalf("tracked write: %v %v", ch, v)
	}
	if _, v, _ := r.Root().GetWatch([]byte("k00042")); v.(int) != 42 {
		t.Fatalf("old tree changed: %v", v)
	}
	txn = r2.Txn()
	txn.TrackMutate(true)
	txn.Insert([]byte("k00042"), -2)
	txn.Commit()
	select {
	case <-ch:
	default:
		t.Fatalf("a tracking transaction's channel was not closed")
	}
}
