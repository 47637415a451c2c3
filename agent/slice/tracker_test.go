package slice

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestTracker(t *testing.T) {
	t.Parallel()
	var tr Tracker
	endOld := tr.Begin("old") // under way before the reconcile
	tr.Begin("done")()        // over before it
	w := tr.Reconcile()
	assert.True(t, w.Fresh("old"), "provisioning when the reconcile began")
	assert.False(t, w.Fresh("done"))
	assert.False(t, w.Fresh("new"))
	endOld()
	assert.True(t, w.Fresh("old"), "still fresh once it ended: its lease may postdate the live list")
	endNew := tr.Begin("new")
	endNew()
	assert.True(t, w.Fresh("new"), "begun during the reconcile")

	fresh, done := w.Sweep()
	assert.ElementsMatch(t, []string{"old", "new"}, fresh)
	begun := make(chan struct{})
	go func() { tr.Begin("late")(); close(begun) }()
	select {
	case <-begun:
		t.Fatal("a provision began during the sweep")
	case <-time.After(50 * time.Millisecond):
	}
	done()
	done() // idempotent
	<-begun
	assert.True(t, w.Fresh("late"))
	w.End()

	w = tr.Reconcile()
	defer w.End()
	for _, a := range []string{"old", "new", "late", "done"} {
		assert.False(t, w.Fresh(a), "%s: nothing under way for a later reconcile", a)
	}
}
