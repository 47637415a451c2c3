package proto

import (
	"fmt"
	"slices"
	"time"
)

// App instances (seed 004 phase 7, launchables): one approved app running
// on one allocation. A tenant launches it (POST
// /v1/allocations/{id}/apps); the launch command's apply re-checks the app
// against the allocation as the ledger has it (sched.EvaluateApp), the
// allocation's state and the caller's ownership, writes the instance
// pending and queues an app.start task for the allocation's node. The
// agent fetches the app's OCI image layout by digest, runs it with its
// apprun.Runner and reports through the task: running (the health check
// passed; with the endpoints the workload proxy dials) or failed. A stop
// queues app.stop. Every wait is bounded: an instance that does not
// report within its bound ends failed with the bound named
// (app_instance_expire, sent by the leader). Releasing the allocation
// ends its instances stopped.
//
// Raft types 92-99 are kept for app instances.
const (
	AppLaunchType         MessageType = 92
	AppStopType           MessageType = 93
	AppInstanceExpireType MessageType = 94
)

func init() {
	messageTypeNames[AppLaunchType] = "app_launch"
	messageTypeNames[AppStopType] = "app_stop"
	messageTypeNames[AppInstanceExpireType] = "app_instance_expire"
}

// App task types (payload AppTaskPayload; the result of app.start is an
// AppTaskResult).
const (
	TaskAppStart = "app.start"
	TaskAppStop  = "app.stop"
)

// IsAppTask reports whether a task type is an app task the agent serves
// on its app loop, not its task loop (a start waits for a health check
// and must not hold up a provision).
func IsAppTask(typ string) bool { return typ == TaskAppStart || typ == TaskAppStop }

// AppInstanceState is where an app instance is in its life cycle.
type AppInstanceState string

const (
	AppInstancePending  AppInstanceState = "pending"
	AppInstanceStarting AppInstanceState = "starting"
	AppInstanceRunning  AppInstanceState = "running"
	AppInstanceStopping AppInstanceState = "stopping"
	AppInstanceStopped  AppInstanceState = "stopped"
	AppInstanceFailed   AppInstanceState = "failed"
)

// AppInstanceStates lists every state.
var AppInstanceStates = []AppInstanceState{AppInstancePending, AppInstanceStarting, AppInstanceRunning,
	AppInstanceStopping, AppInstanceStopped, AppInstanceFailed}

// Terminal reports whether s is final (a new launch of the app on the
// allocation replaces the instance).
func (s AppInstanceState) Terminal() bool { return s == AppInstanceStopped || s == AppInstanceFailed }

// Valid reports whether s is a known state.
func (s AppInstanceState) Valid() bool { return slices.Contains(AppInstanceStates, s) }

// Bounds of app instances.
const (
	// AppStartBound is how long a launch may take from the launch
	// command to running (image fetch, unpack, start and the health
	// check) on top of the app's health check timeout before the leader
	// ends it failed.
	AppStartBound = 5 * time.Minute
	// AppStopBound is how long a stop may take.
	AppStopBound = 2 * time.Minute
	// MaxAppInstanceEvents bounds an instance's own timeline (the
	// allocation's timeline keeps every line).
	MaxAppInstanceEvents = 32
	// MaxAppDetail bounds an instance's detail text.
	MaxAppDetail = 1024
	// MaxAppLogBytes is the most log bytes one logs request returns.
	MaxAppLogBytes = 1 << 20
)

// AppStartDeadline is how long a launch of app may stay pending or
// starting: AppStartBound plus its health check timeout.
func AppStartDeadline(app *App) time.Duration {
	d := AppStartBound
	if app.HealthCheck != nil {
		d += time.Duration(app.HealthCheck.TimeoutSeconds) * time.Second
	}
	return d
}

// AppInstanceEvent is one line of an instance's timeline.
type AppInstanceEvent struct {
	At      time.Time        `json:"at"`
	State   AppInstanceState `json:"state"`
	Message string           `json:"message,omitempty"`
}

// AppInstance is one app running (or having run) on one allocation; an
// allocation has at most one instance per app name.
type AppInstance struct {
	ID           string  `json:"id"`
	AllocationID string  `json:"allocation_id"`
	NodeID       string  `json:"node_id"`
	App          string  `json:"app"`
	Version      string  `json:"version"`
	Kind         AppKind `json:"kind"`
	// Image is the app's OCI image by digest.
	Image string `json:"image"`
	// Owner is the allocation's owner; LaunchedBy who launched it (the
	// owner, or an admin).
	Owner          string           `json:"owner"`
	LaunchedBy     string           `json:"launched_by"`
	IdempotencyKey string           `json:"idempotency_key,omitempty"`
	State          AppInstanceState `json:"state"`
	// Detail says why the instance failed or stopped.
	Detail string `json:"detail,omitempty"`
	// Endpoints maps each app port (decimal) to the address the owning
	// agent dials for it (the workload proxy's upstream; private to the
	// site).
	Endpoints map[string]string `json:"endpoints,omitempty"`
	// ProxyPath is where the owner reaches the app's first HTTP port
	// through the workload proxy.
	ProxyPath string `json:"proxy_path"`
	// StartTask and StopTask are the agent tasks of the current launch
	// and stop.
	StartTask string `json:"start_task,omitempty"`
	StopTask  string `json:"stop_task,omitempty"`
	// Deadline is when the leader ends a pending, starting or stopping
	// instance failed if its agent has not reported.
	Deadline  *time.Time         `json:"deadline,omitempty"`
	Events    []AppInstanceEvent `json:"events"`
	CreatedAt time.Time          `json:"created_at"`
	UpdatedAt time.Time          `json:"updated_at"`
	Meta
}

// AppProxyPath is where the workload proxy serves an allocation's app.
func AppProxyPath(alloc, app string) string {
	return "/v1/allocations/" + alloc + "/apps/" + app + "/proxy/"
}

// AppInstanceID names the n-th launch of app on alloc.
func AppInstanceID(alloc, app string, n uint64) string {
	return fmt.Sprintf("%s.%s.%d", alloc, app, n)
}

// AppLaunchBody is the body of POST /v1/allocations/{id}/apps.
type AppLaunchBody struct {
	App     string `json:"app"`
	Version string `json:"version,omitempty"`
}

// AppLaunchRequest launches an app (command 92). The apply re-checks
// everything: the app approved and compatible with the allocation as the
// ledger has it, the allocation active, the caller its owner (or an
// admin).
type AppLaunchRequest struct {
	At             time.Time `json:"at"`
	AllocationID   string    `json:"allocation_id"`
	App            string    `json:"app"`
	Version        string    `json:"version"`
	Caller         string    `json:"caller"`
	Admin          bool      `json:"admin,omitempty"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
}

// Validate checks the request's fields (not its authority).
func (r *AppLaunchRequest) Validate() error {
	if err := ValidateID("allocation id", r.AllocationID); err != nil {
		return err
	}
	if err := ValidateAppKey(r.App, r.Version); err != nil {
		return err
	}
	if err := ValidateAppInstanceName(r.App); err != nil {
		return err
	}
	if err := ValidateID("caller", r.Caller); err != nil {
		return err
	}
	if r.IdempotencyKey != "" {
		if err := ValidateIdempotencyKey(r.IdempotencyKey); err != nil {
			return err
		}
	}
	return nil
}

// ValidateAppInstanceName refuses app names the instance routes reserve
// (GET /v1/allocations/{id}/apps/compatible).
func ValidateAppInstanceName(name string) error {
	if name == "compatible" {
		return Errorf(CodeInvalidArgument, "app name %q is reserved (GET /v1/allocations/{id}/apps/compatible)", name)
	}
	return nil
}

// AppStopRequest stops an app instance (command 93).
type AppStopRequest struct {
	At           time.Time `json:"at"`
	AllocationID string    `json:"allocation_id"`
	App          string    `json:"app"`
	Caller       string    `json:"caller"`
	Admin        bool      `json:"admin,omitempty"`
}

// AppInstanceExpireRequest ends instances whose deadline passed without a
// report from their agent (command 94, proposed by the leader). Each named
// instance is ended only if it is still in the state and launch the
// leader saw.
type AppInstanceExpireRequest struct {
	At        time.Time             `json:"at"`
	Instances []AppInstanceExpiring `json:"instances"`
}

// AppInstanceExpiring names one instance to expire.
type AppInstanceExpiring struct {
	AllocationID string           `json:"allocation_id"`
	App          string           `json:"app"`
	ID           string           `json:"id"`
	State        AppInstanceState `json:"state"`
}

// AppTaskPayload is the payload of app.start and app.stop.
type AppTaskPayload struct {
	InstanceID   string `json:"instance_id"`
	AllocationID string `json:"allocation_id"`
	// AppName is the app's name (the instance's key on its allocation).
	AppName string `json:"app_name"`
	// App is the approved manifest (app.start only).
	App *App `json:"app,omitempty"`
	// GuestAddr is the slice guest's private address ("" on bare metal
	// and on simulated slices).
	GuestAddr string `json:"guest_addr,omitempty"`
	// Deadline bounds the agent's work (the leader expires the instance
	// then).
	Deadline time.Time `json:"deadline"`
}

// AppTaskResult is the result of an app task: the instance as the
// runner saw it last.
type AppTaskResult struct {
	InstanceID string            `json:"instance_id"`
	State      AppInstanceState  `json:"state"`
	Detail     string            `json:"detail,omitempty"`
	Endpoints  map[string]string `json:"endpoints,omitempty"`
}

// AppBlobPath is where an app's OCI image layout archive is served.
func AppBlobPath(name, version string) string { return "/v1/apps/" + name + "/" + version + "/blob" }

// AppImageRef is the image cache's reference to an app's OCI layout
// archive in the coordinators' blob store.
func AppImageRef(app *App) (ImageRef, error) {
	_, digest, ok := cutDigest(app.Image)
	if !ok {
		return ImageRef{}, Errorf(CodeInvalidArgument, "app %s: image %q names no digest", app, app.Image)
	}
	if app.Archive != "" {
		// The archive is keyed by its own digest, not the image's
		// (App.Archive).
		digest = app.Archive
	}
	if app.ImageSize <= 0 {
		return ImageRef{}, Errorf(CodeIllegalTransition, "app %s: image_size is not set: its OCI layout archive was never published to the coordinators' blob store (PUT %s)", app, AppBlobPath(app.Name, app.Version))
	}
	return ImageRef{Name: "app-" + app.Name, Version: app.Version, Kind: "oci_layout", Digest: digest, Size: app.ImageSize,
		URL: AppBlobPath(app.Name, app.Version)}, nil
}

func cutDigest(ref string) (string, string, bool) {
	for i := len(ref) - 1; i >= 0; i-- {
		if ref[i] == '@' {
			return ref[:i], ref[i+1:], true
		}
	}
	return "", "", false
}

// AppLogs answers GET /v1/allocations/{id}/apps/{app}/logs.
type AppLogs struct {
	AllocationID string `json:"allocation_id"`
	App          string `json:"app"`
	InstanceID   string `json:"instance_id"`
	// Logs is the end of the instance's output (at most ?max_bytes).
	Logs      string `json:"logs"`
	Truncated bool   `json:"truncated,omitempty"`
}

// AppProxySession is the audit record of one workload proxy session (the
// record's "after").
type AppProxySession struct {
	AllocationID string    `json:"allocation_id"`
	App          string    `json:"app"`
	InstanceID   string    `json:"instance_id"`
	User         string    `json:"user"`
	Method       string    `json:"method"`
	Path         string    `json:"path"`
	WebSocket    bool      `json:"websocket,omitempty"`
	Status       int       `json:"status"`
	OpenedAt     time.Time `json:"opened_at"`
	ClosedAt     time.Time `json:"closed_at"`
	BytesIn      int64     `json:"bytes_in"`
	BytesOut     int64     `json:"bytes_out"`
	Error        string    `json:"error,omitempty"`
}

// AgentAppProxyPath is where an agent parks its workload proxy
// connections on a coordinator (GET, a WebSocket with the node
// credential). A parked connection carries one proxy session: the
// coordinator sends one AppProxyDial text message naming the instance and
// port, the agent answers with an AppProxyDial of its own (Error empty:
// connected to the upstream), then the connection carries the session's
// bytes both ways as binary messages until either side closes. The agent
// parks only while it has a live app instance, and a replacement as soon
// as one is taken; a node holds at most 8 on a coordinator (429 past it).
const AgentAppProxyPath = "/v1/agent/app-proxy"

// AppProxyDial is the one control message each way of a parked proxy
// connection.
type AppProxyDial struct {
	InstanceID string `json:"instance_id"`
	Port       int    `json:"port"`
	// Logs > 0 asks for the end of the instance's output instead (at
	// most Logs bytes, sent as one binary message).
	Logs  int    `json:"logs,omitempty"`
	Error string `json:"error,omitempty"`
}
