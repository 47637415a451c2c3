// Package apprun starts, watches and stops app instances (seed 004 phase
// 7: launchables) inside an allocation. The agent's app tasks drive a
// Runner; which Runner runs depends on the host: the guest runner reaches a
// slice's guest over its private address through a channel the agent owns
// and runs the app's OCI image with a real OCI runtime there; the lab's
// simulated slices (no guest) use a local runner standing in for the guest.
//
// The guest runner's channel is SSH with the allocation's own agent key
// (agent/slice keys.go), not a guest agent: the key already exists, is
// authorized by the guest's seed, opens exactly one guest and dies with
// it, and every slice image already runs sshd, so nothing new listens in
// the guest and no agent binary ships inside tenant images (guest.go
// explains the rest: image, bundle, runtime). Both runners run the same
// verified bundle with a real OCI runtime (crun; runc on a cgroup v1 host
// for the local runner).
//
// This file is the contract between the agent's task code (above) and the
// runners (below); change it only in both places at once.
package apprun

import (
	"context"
	"errors"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// Spec is one app instance to run.
type Spec struct {
	// InstanceID names the instance; Start is idempotent per InstanceID
	// (a restarted agent calling Start again converges on the one
	// instance, never two).
	InstanceID   string
	AllocationID string
	// App is the approved manifest: the OCI image by digest, the ports
	// it serves and the health check that gates running.
	App proto.App
	// ImagePath is the local path of the app's OCI image layout archive
	// (a tar), already verified against App.Image's digest.
	ImagePath string
	// GuestAddr is the address the app runs at: the slice guest's
	// private IPv4, or the node's own address on bare metal.
	GuestAddr string
	// GPUs are the PCI addresses of the allocation's GPUs as the guest
	// sees them (empty in the simulated lab).
	GPUs []string
	// Env is extra environment for the app's process.
	Env map[string]string
}

// State is where a running instance is, as its runner sees it.
type State string

const (
	StateStarting State = "starting"
	StateRunning  State = "running"
	StateStopped  State = "stopped"
	StateFailed   State = "failed"
)

// Status is an instance's state as its runner sees it.
type Status struct {
	InstanceID string
	State      State
	// Detail names the reason when State is failed (e.g. "health check
	// GET :8080/healthz: connection refused after 30s").
	Detail string
	// Endpoints maps each app port to the "host:port" the agent dials to
	// reach it (the workload proxy's upstream).
	Endpoints map[int]string
	StartedAt time.Time
}

// ErrNotFound is returned by Status, Stop and Logs for an instance the
// runner does not know (Stop treats it as already stopped and returns nil).
var ErrNotFound = errors.New("apprun: no such app instance")

// Runner runs app instances.
type Runner interface {
	// Start unpacks and starts the instance and returns once its health
	// check passed (running) or it failed, bounded by ctx. Calling it
	// again for a running instance returns its status.
	Start(ctx context.Context, s Spec) (Status, error)
	// Stop stops the instance and removes its container and files;
	// stopping an unknown instance is not an error.
	Stop(ctx context.Context, instanceID string) error
	// Status reports the instance as the runner sees it now (the guest
	// runner asks the guest: an SSH connection and the runtime's state,
	// ~0.5 s under TCG).
	Status(ctx context.Context, instanceID string) (Status, error)
	// Endpoints returns the addresses of a started instance's ports from
	// the runner's own record, without asking the guest or the runtime:
	// the workload proxy's per-request lookup (a dead app shows as its
	// endpoint refusing the dial). ErrNotFound for an unknown instance.
	Endpoints(ctx context.Context, instanceID string) (map[int]string, error)
	// Logs returns at most maxBytes of the end of the instance's output.
	Logs(ctx context.Context, instanceID string, maxBytes int) ([]byte, error)
}
