package main

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// phase is one bounded step of the lab's start-up: the cluster's
// election, the real slice host's set-up and guest image build, the
// hosts' onboarding. Each has its own bound, started when the step
// starts, so a slow step (the first guest image build takes minutes)
// does not use up the next one's time; and an error from a step whose
// bound ran out says which step and which bound.
type phase struct {
	name  string
	bound time.Duration
}

// run calls step with a context bounded by the phase's bound (and
// parent). When the bound ran out the error names the phase and the
// bound.
func (p phase) run(parent context.Context, step func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(parent, p.bound)
	defer cancel()
	err := step(ctx)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && parent.Err() == nil {
		return fmt.Errorf("%s did not finish within its %s bound: %w", p.name, p.bound, err)
	}
	return err
}

// sliceHostBound bounds the real slice host's set-up: libvirtd's first
// start (~70 s) and the first build of the two guest images (~95 s, more
// on a busy machine).
const sliceHostBound = 10 * time.Minute
