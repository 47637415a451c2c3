package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The start-up as run() runs it: the cluster's phase, a slow image build
// phase that takes longer than the start-up bound, then onboarding. The
// onboarding must still get its whole bound (the first `make lab` used
// to die in "put site lab" after the image build ate the bound).
func TestPhasesASlowImageBuildDoesNotUseUpTheNextBound(t *testing.T) {
	const startBound = 200 * time.Millisecond
	parent := context.Background()
	require.NoError(t, phase{"cluster", startBound}.run(parent, func(ctx context.Context) error { return nil }))
	require.NoError(t, phase{"image build", 5 * time.Second}.run(parent, func(ctx context.Context) error {
		select { // the build: longer than startBound
		case <-time.After(3 * startBound):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}))
	err := phase{"onboarding", startBound}.run(parent, func(ctx context.Context) error {
		dl, ok := ctx.Deadline()
		require.True(t, ok)
		assert.Greater(t, time.Until(dl), startBound/2, "onboarding starts with its whole bound")
		return ctx.Err()
	})
	require.NoError(t, err)
}

func TestPhaseThatRunsOutNamesItselfAndItsBound(t *testing.T) {
	err := phase{"onboarding the hosts", 50 * time.Millisecond}.run(context.Background(), func(ctx context.Context) error {
		<-ctx.Done()
		return errors.New("put site lab: " + ctx.Err().Error())
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "onboarding the hosts did not finish within its 50ms bound")
	assert.Contains(t, err.Error(), "put site lab")

	// A step's own error within the bound is passed on as it is.
	err = phase{"x", time.Minute}.run(context.Background(), func(context.Context) error { return errors.New("boom") })
	assert.EqualError(t, err, "boom")

	// A signal (the parent ending) is not the phase's bound running out.
	parent, cancel := context.WithCancel(context.Background())
	cancel()
	err = phase{"x", time.Minute}.run(parent, func(ctx context.Context) error { return ctx.Err() })
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotContains(t, err.Error(), "bound")
}
