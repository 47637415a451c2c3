package ui

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

const pageLimit = 50

func esc(s string) string { return url.PathEscape(s) }

// listQuery carries the paging cursor and the filters a list page takes.
func listQuery(r *http.Request, filters ...string) url.Values {
	q := url.Values{"limit": {strconv.Itoa(pageLimit)}}
	in := r.URL.Query()
	for _, f := range append(filters, "after") {
		if v := strings.TrimSpace(in.Get(f)); v != "" {
			q.Set(f, v)
		}
	}
	return q
}

// nextURL is the page after this one, keeping the filters.
func nextURL(r *http.Request, next string) string {
	if next == "" {
		return ""
	}
	q := r.URL.Query()
	q.Del("index")
	q.Del("msg")
	q.Set("after", next)
	return r.URL.Path + "?" + q.Encode()
}

type allocationsData struct {
	Items []*proto.Allocation
	Next  string
	State string
}

func (u *UI) allocations(q *req) error {
	var l proto.List[*proto.Allocation]
	v := listQuery(q.r, "state", "region")
	for k, vs := range after(q.readIndex()) {
		v[k] = vs
	}
	if _, err := q.api.get("/v1/allocations", v, &l); err != nil {
		return err
	}
	return u.render(q, http.StatusOK, "allocations", "Allocations", "allocations",
		allocationsData{Items: l.Items, Next: nextURL(q.r, l.Next), State: q.r.URL.Query().Get("state")})
}

// ---- launch wizard ----

type regionChoice struct {
	Name     string
	Disabled bool
	Why      string // why it is disabled, or what it lacks
	Selected bool
}

type shapeChoice struct {
	Value     string // "slice-N" or "baremetal"
	Label     string
	SKU       string
	Shape     proto.CapacityShape
	GPUs      int
	Placeable bool
	Free      string // live availability
	Reason    string // the scheduler's reason when not placeable
	Disk      string // slices: "2 × raw NVMe, at least 3.5 TiB each"
	Selected  bool
}

type imageChoice struct {
	Ref   string // name:version
	Label string
	Kind  proto.ImageKind
}

type launchData struct {
	Regions   []regionChoice
	Region    string
	Shapes    []shapeChoice
	Images    []imageChoice
	ImagesErr string
	SavedKeys []string
	DiskSize  string
	// Ingress is the region's public ingress (nil: unknown); the
	// network step offers it or says why not.
	Ingress *proto.IngressOffer
	Form    launchForm
	Error   string
}

type launchForm struct {
	Region  string
	Shape   string
	Image   string
	SSHKey  string
	Network string // private_nat (default) or public
	Ingress string // public ingress rules, "tcp/22 tcp/8888"
	Key     string // idempotency key (review onwards)
}

func (u *UI) launch(q *req) error {
	d, err := u.launchData(q, launchForm{Region: q.r.URL.Query().Get("region"), Shape: q.r.URL.Query().Get("shape")})
	if err != nil {
		return err
	}
	return u.render(q, http.StatusOK, "launch", "Launch H200 capacity", "launch", d)
}

// launchShapes is the wizard's shape step for one region (htmx swaps it
// in when the region changes).
func (u *UI) launchShapes(q *req) error {
	region := q.r.URL.Query().Get("region")
	shapes, err := u.shapes(q, region, q.r.URL.Query().Get("shape"))
	if err != nil {
		return err
	}
	return u.fragment(q, "launch", "shapes", launchData{Region: region, Shapes: shapes})
}

func (u *UI) launchData(q *req, f launchForm) (launchData, error) {
	d := launchData{Form: f}
	var regions proto.List[*proto.Region]
	if _, err := q.api.get("/v1/regions", url.Values{"limit": {strconv.Itoa(proto.MaxPageLimit)}}, &regions); err != nil {
		return d, err
	}
	var av proto.List[*proto.Availability]
	if _, err := q.api.get("/v1/availability", nil, &av); err != nil {
		return d, err
	}
	free := map[string]int{}
	for _, a := range av.Items {
		free[a.Region] += len(a.Placeable)
	}
	for _, r := range regions.Items {
		c := regionChoice{Name: r.Name, Disabled: r.Disabled}
		switch {
		case r.Disabled:
			c.Why = "not yet open"
		case free[r.Name] == 0:
			c.Why = "no capacity now"
		}
		if d.Form.Region == "" && !r.Disabled {
			d.Form.Region = r.Name
		}
		c.Selected = r.Name == d.Form.Region && !r.Disabled
		d.Regions = append(d.Regions, c)
	}
	d.Region = d.Form.Region
	var err error
	if d.Region != "" {
		if d.Shapes, err = shapesFrom(av.Items, d.Region, d.Form.Shape); err != nil {
			return d, err
		}
		d.Ingress = regionIngress(av.Items, d.Region)
		d.DiskSize = regionDisk(av.Items, d.Region)
	}
	var imgs proto.List[*proto.Image]
	if _, err := q.api.get("/v1/images", url.Values{"state": {string(proto.ImageApproved)}}, &imgs); err != nil {
		d.ImagesErr = errText(err)
	}
	for _, im := range imgs.Items {
		if im.Kind != proto.ImageSliceBase && im.Kind != proto.ImageSliceCUDA {
			continue
		}
		what := "base (no CUDA)"
		if im.Kind == proto.ImageSliceCUDA {
			what = "CUDA"
		}
		d.Images = append(d.Images, imageChoice{Ref: im.Name + ":" + im.Version, Kind: im.Kind,
			Label: fmt.Sprintf("%s:%s — %s, %s", im.Name, im.Version, what, humanBytes(uint64(im.Size)))})
	}
	// Saved keys: the ones the caller's earlier allocations used.
	var mine proto.List[*proto.Allocation]
	if _, err := q.api.get("/v1/allocations", url.Values{"limit": {"200"}}, &mine); err == nil {
		for _, a := range mine.Items {
			if a.Owner != q.who.Name {
				continue
			}
			for _, k := range a.SSHPublicKeys {
				if !slices.Contains(d.SavedKeys, k) {
					d.SavedKeys = append(d.SavedKeys, k)
				}
			}
		}
	}
	return d, nil
}

func (u *UI) shapes(q *req, region, selected string) ([]shapeChoice, error) {
	var av proto.List[*proto.Availability]
	if _, err := q.api.get("/v1/availability", url.Values{"region": {region}}, &av); err != nil {
		return nil, err
	}
	return shapesFrom(av.Items, region, selected)
}

// shapesFrom turns availability rows into the wizard's choices: bare
// metal, then slices by GPU count, each placeable or with the
// scheduler's reason.
func shapesFrom(av []*proto.Availability, region, selected string) ([]shapeChoice, error) {
	var out []shapeChoice
	for _, shape := range []proto.CapacityShape{proto.ShapeBaremetal, proto.ShapeGPUSlice} {
		for _, a := range av {
			if a.Region != region || a.CapacityShape != shape {
				continue
			}
			counts := slices.Clone(a.Placeable)
			for _, un := range a.Unplaceable {
				counts = append(counts, un.GPUCount)
			}
			slices.Sort(counts)
			for _, n := range slices.Compact(counts) {
				c := shapeChoice{SKU: a.SKU, Shape: shape, GPUs: n, Placeable: slices.Contains(a.Placeable, n)}
				if shape == proto.ShapeBaremetal {
					c.Value, c.Label = "baremetal", fmt.Sprintf("Bare-metal node (%d GPUs, whole host)", n)
					c.Free = fmt.Sprintf("%d node(s) free", a.FreeNodes)
				} else {
					c.Value, c.Label = "slice-"+strconv.Itoa(n), fmt.Sprintf("GPU slice, %d GPU%s", n, plural(n))
					c.Free = fmt.Sprintf("%d GPUs free on %d node(s)", a.FreeGPUs, a.FreeNodes)
					if a.SlotNVMeBytes > 0 {
						c.Disk = fmt.Sprintf("%d × raw NVMe, at least %s each", n, humanBytes(a.SlotNVMeBytes))
					}
				}
				for _, un := range a.Unplaceable {
					if un.GPUCount == n {
						c.Reason = un.Reason
					}
				}
				if a.RegionDisabled {
					c.Reason = "region " + region + " is not open"
				}
				c.Selected = c.Value == selected && c.Placeable
				out = append(out, c)
			}
		}
	}
	if selected == "" {
		for i := range out {
			if out[i].Placeable && out[i].Shape == proto.ShapeGPUSlice {
				out[i].Selected = true
				break
			}
		}
	}
	return out, nil
}

// regionIngress is the region's public ingress offer (from its slice
// availability row).
func regionIngress(av []*proto.Availability, region string) *proto.IngressOffer {
	for _, a := range av {
		if a.Region == region && a.CapacityShape == proto.ShapeGPUSlice && a.Ingress != nil {
			return a.Ingress
		}
	}
	return nil
}

// regionDisk is the smallest raw NVMe a slice's slot gets in the region
// now (from its slice availability rows; tenants may not read slots), or
// "" when none is reported.
func regionDisk(av []*proto.Availability, region string) string {
	var least uint64
	for _, a := range av {
		if a.Region == region && a.CapacityShape == proto.ShapeGPUSlice && a.SlotNVMeBytes > 0 && (least == 0 || a.SlotNVMeBytes < least) {
			least = a.SlotNVMeBytes
		}
	}
	if least == 0 {
		return ""
	}
	return humanBytes(least)
}

// ingressAllowed renders an offer's ports ("tcp: 22, 8000-8999").
func ingressAllowed(o *proto.IngressOffer) string {
	if o == nil {
		return ""
	}
	var ports []string
	for _, r := range o.AllowedPorts {
		ports = append(ports, r.String())
	}
	return strings.Join(o.Protocols, "/") + " ports " + strings.Join(ports, ", ") + fmt.Sprintf(", up to %d per tenant", o.QuotaPerTenant)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// request turns the wizard's form into the API's create request, with
// the shape it chose.
func (u *UI) request(q *req, f launchForm) (proto.AllocationCreateRequest, shapeChoice, error) {
	req := proto.AllocationCreateRequest{Region: f.Region}
	var s shapeChoice
	if f.Region == "" {
		return req, s, badInput("choose a region")
	}
	shapes, err := u.shapes(q, f.Region, f.Shape)
	if err != nil {
		return req, s, err
	}
	i := slices.IndexFunc(shapes, func(s shapeChoice) bool { return s.Value == f.Shape })
	if i < 0 {
		return req, s, badInput("shape %q is not offered in region %s", f.Shape, f.Region)
	}
	s = shapes[i]
	req.CapacityShape, req.SKU = s.Shape, s.SKU
	if s.Shape == proto.ShapeGPUSlice {
		req.GPUCount = s.GPUs
		req.Image = f.Image
	}
	if k := strings.TrimSpace(f.SSHKey); k != "" {
		req.SSHPublicKeys = []string{k}
	}
	switch f.Network {
	case "", "private_nat":
	case "public":
		if s.Shape != proto.ShapeGPUSlice {
			return req, s, badInput("public ingress is for GPU slices")
		}
		rules := strings.Fields(strings.ReplaceAll(f.Ingress, ",", " "))
		if len(rules) == 0 {
			return req, s, badInput("public ingress: name the ports to open, e.g. tcp/22")
		}
		if _, err := proto.ParseIngressRules(rules); err != nil {
			return req, s, badInput("public ingress: %s", errText(err))
		}
		req.Ingress = rules
	default:
		return req, s, badInput("network %q is not private_nat or public", f.Network)
	}
	return req, s, nil
}

func readForm(r *http.Request) launchForm {
	p := r.PostForm
	return launchForm{Region: p.Get("region"), Shape: p.Get("shape"), Image: p.Get("image"),
		SSHKey: strings.TrimSpace(p.Get("ssh_key")), Network: p.Get("network"), Ingress: strings.TrimSpace(p.Get("ingress")), Key: p.Get("idempotency_key")}
}

type reviewData struct {
	Form    launchForm
	Request proto.AllocationCreateRequest
	Steps   []string
	Unit    string
	Storage string
}

func (u *UI) launchReview(q *req) error {
	f := readForm(q.r)
	if f.SSHKey == "" {
		f.SSHKey = strings.TrimSpace(q.r.PostForm.Get("saved_key"))
	}
	req, shape, err := u.request(q, f)
	if err != nil {
		d, derr := u.launchData(q, f)
		if derr != nil {
			return derr
		}
		d.Error = errText(err)
		return u.render(q, statusOf(err), "launch", "Launch H200 capacity", "launch", d)
	}
	f.Key = "ui-" + randomToken()
	steps := []string{"placement picks the node and slots (the scheduler, in the Raft ledger)"}
	unit := fmt.Sprintf("%d GPU-hour(s) per hour, metered from activation to release", req.GPUCount)
	storage := "the node's own disks (the whole host)"
	if req.CapacityShape == proto.ShapeGPUSlice {
		storage = shape.Disk
		if storage == "" {
			storage = fmt.Sprintf("%d × raw NVMe (one per GPU, size not reported)", req.GPUCount)
		}
		steps = append(steps, "the node's agent leases the slots and plans the bundle", "the image is verified and cloned onto each slot's raw NVMe",
			"a NoCloud seed carries your SSH key; the VM is defined and started", "the guest's reserved DHCP lease, then SSH ready")
	} else {
		unit = "8 GPU-hours per hour (the whole node), metered from activation to release"
		steps = append(steps, "MAAS deploys the machine with your SSH key (seed 002's buckets)", "the machine's address, then SSH")
	}
	return u.render(q, http.StatusOK, "review", "Review", "launch", reviewData{Form: f, Request: req, Steps: steps, Unit: unit, Storage: storage})
}

func (u *UI) launchCreate(q *req) error {
	f := readForm(q.r)
	if f.Key == "" {
		return badInput("the form has no idempotency key; start the wizard again")
	}
	req, _, err := u.request(q, f)
	if err != nil {
		return err
	}
	var a proto.Allocation
	idx, err := q.api.send(http.MethodPost, "/v1/allocations", req, http.Header{proto.IdempotencyKeyHeader: {f.Key}}, &a)
	if err != nil {
		return err
	}
	return q.redirect(Prefix+"allocations/"+esc(a.ID), idx, "")
}

// ---- allocation page ----

type bar struct {
	started  time.Time
	Progress *stageProgress // byte progress of a running stage (clone, image, wipe)
	Stage    string
	Status   string // succeeded | failed | running | pending | info
	Start    string // offset from the first event
	Duration string
	X, W     float64 // percent of the chart
	Message  string
}

type claimRow struct {
	Claim proto.Claim
	Slot  *proto.Slot
}

type allocData struct {
	A          proto.Allocation
	Bars       []bar
	Span       string
	Claims     []claimRow
	Tasks      []*proto.Task
	Events     []proto.TimelineEvent
	Live       bool
	Releasable bool // live and not releasing yet
	AllocLive  bool // holds capacity (apps may run on it)
	Index      uint64
	Lease      string
	Failed     string
	Progress   string
}

func inProgress(s proto.AllocState) bool {
	return s == proto.AllocPending || s == proto.AllocPlaced || s == proto.AllocProvisioning || s == proto.AllocReleasing
}

func (u *UI) allocationData(q *req, id string, index uint64, wait string) (allocData, error) {
	var d allocData
	// The live part waits on the allocation's task list, as gpuaasctl
	// alloc create --wait does: it answers as soon as a task or the
	// allocation changes, and every stage event and every byte-progress
	// report (the agent's clone, at most once a second) rewrites the
	// task. Then the timeline and the rest are read at once.
	tq := url.Values{"limit": {"100"}}
	if index > 0 && wait != "" {
		tq.Set("index", strconv.FormatUint(index, 10))
		tq.Set("wait", wait)
	}
	var ts proto.List[*proto.Task]
	idx, err := q.api.get("/v1/allocations/"+esc(id)+"/tasks", tq, &ts)
	if err != nil {
		return d, err
	}
	d.Index = idx
	d.Tasks = ts.Items
	var tl proto.List[proto.TimelineEvent]
	if _, err := q.api.get("/v1/allocations/"+esc(id)+"/timeline", nil, &tl); err != nil {
		return d, err
	}
	if _, err := q.api.get("/v1/allocations/"+esc(id), nil, &d.A); err != nil {
		return d, err
	}
	var cl proto.List[proto.Claim]
	if _, err := q.api.get("/v1/allocations/"+esc(id)+"/claims", nil, &cl); err != nil {
		return d, err
	}
	for _, c := range cl.Items {
		row := claimRow{Claim: c}
		if c.SlotID != "" && q.Can("GET /v1/slots/{id}") {
			var s proto.Slot
			if _, err := q.api.get("/v1/slots/"+esc(c.SlotID), nil, &s); err == nil {
				row.Slot = &s
			}
		}
		d.Claims = append(d.Claims, row)
	}
	d.Events = tl.Items
	d.Live = inProgress(d.A.State)
	d.AllocLive = d.A.Live()
	d.Releasable = d.AllocLive && d.A.State != proto.AllocReleasing
	d.Bars, d.Span = gantt(d.A, tl.Items, u.now())
	for _, b := range d.Bars {
		if b.Status == "failed" {
			d.Failed = b.Stage
		}
		if b.Stage == proto.StageDHCPLease {
			d.Lease = map[string]string{"succeeded": "bound", "running": "waiting", "failed": "not bound", "pending": "pending"}[b.Status]
		}
	}
	for _, t := range d.Tasks {
		if t.State != proto.TaskRunning || t.Total <= 0 || t.Stage == "" {
			continue
		}
		for i := range d.Bars {
			b := &d.Bars[i]
			if b.Stage != t.Stage || b.Status != "running" {
				continue
			}
			b.Progress = progressOf(t.Done, t.Total, u.now().Sub(b.started))
			d.Progress = t.Stage + ": " + b.Progress.Text
		}
	}
	return d, nil
}

// gantt lays the timeline out as bars: one per stage (from its started
// event to the event that ended it), the expected stages not reached yet
// as pending, on a scale from the allocation's creation to now (or its
// last event once it has ended).
func gantt(a proto.Allocation, evs []proto.TimelineEvent, now time.Time) ([]bar, string) {
	type span struct {
		start, end time.Time
		status     string
		msg        string
	}
	var order []string
	spans := map[string]*span{}
	t0 := a.CreatedAt
	last := t0
	for _, e := range evs {
		if t0.IsZero() || e.At.Before(t0) {
			t0 = e.At
		}
		if e.At.After(last) {
			last = e.At
		}
		s, ok := spans[e.Stage]
		if !ok || e.Status == "started" && s.status != "running" {
			if !ok {
				order = append(order, e.Stage)
			}
			s = &span{start: e.At, end: e.At, status: "info"}
			spans[e.Stage] = s
		}
		switch e.Status {
		case "started":
			s.status = "running"
		case "succeeded", "failed":
			s.status = e.Status
			s.end = e.At
		default:
			s.end = e.At
		}
		if e.Message != "" {
			s.msg = e.Message
		}
	}
	end := last
	if inProgress(a.State) && now.After(end) {
		end = now
	}
	total := end.Sub(t0)
	if total <= 0 {
		total = time.Millisecond
	}
	pct := func(d time.Duration) float64 { return float64(d) / float64(total) * 100 }
	var bars []bar
	for _, st := range order {
		s := spans[st]
		e := s.end
		if s.status == "running" {
			e = end
		}
		b := bar{started: s.start, Stage: st, Status: s.status, Message: s.msg, Start: "+" + roundDur(s.start.Sub(t0)),
			X: pct(s.start.Sub(t0)), W: max(pct(e.Sub(s.start)), 0.5)}
		if s.status != "info" {
			b.Duration = roundDur(e.Sub(s.start))
		}
		if b.X+b.W > 100 {
			b.W = 100 - b.X
		}
		bars = append(bars, b)
	}
	if a.Shape == proto.ShapeGPUSlice && a.Live() && a.State != proto.AllocReleasing {
		for _, st := range proto.SliceStages {
			if _, ok := spans[st]; !ok {
				bars = append(bars, bar{Stage: st, Status: "pending", X: 100, W: 0})
			}
		}
	}
	return bars, roundDur(end.Sub(t0))
}

// stageProgress is a running stage's byte progress as the agent last
// reported it.
type stageProgress struct {
	Pct  float64
	Text string // "1.2 GiB of 4.0 GiB (30%), 210.5 MiB/s"
}

func progressOf(done, total int64, elapsed time.Duration) *stageProgress {
	if total <= 0 {
		return nil
	}
	done = min(max(done, 0), total)
	p := &stageProgress{Pct: 100 * float64(done) / float64(total)}
	p.Text = fmt.Sprintf("%s of %s (%.0f%%)", humanBytes(uint64(done)), humanBytes(uint64(total)), p.Pct)
	if elapsed > time.Second && done > 0 {
		p.Text += fmt.Sprintf(", %s/s", humanBytes(uint64(float64(done)/elapsed.Seconds())))
	}
	return p
}

func roundDur(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

func (u *UI) allocation(q *req) error {
	id := q.r.PathValue("id")
	// Read-your-writes: the first read waits for the write's index.
	if idx := q.readIndex(); idx > 0 {
		var a proto.Allocation
		if _, err := q.api.get("/v1/allocations/"+esc(id), after(idx), &a); err != nil {
			return err
		}
	}
	d, err := u.allocationData(q, id, 0, "")
	if err != nil {
		return err
	}
	return u.render(q, http.StatusOK, "allocation", "Allocation "+id, "allocations", d)
}

// allocationLive is the live part of the allocation page, answered by a
// blocking query on the timeline from the index the page last saw.
func (u *UI) allocationLive(q *req) error {
	id := q.r.PathValue("id")
	idx, _ := strconv.ParseUint(q.r.URL.Query().Get("index"), 10, 64)
	d, err := u.allocationData(q, id, idx, "3s")
	if err != nil {
		return err
	}
	return u.fragment(q, "allocation", "live", d)
}

func (u *UI) releaseConfirm(q *req) error {
	id := q.r.PathValue("id")
	var a proto.Allocation
	if _, err := q.api.get("/v1/allocations/"+esc(id), nil, &a); err != nil {
		return err
	}
	return u.render(q, http.StatusOK, "release", "Release "+id, "allocations", a)
}

func (u *UI) release(q *req) error {
	id := q.r.PathValue("id")
	if q.r.PostForm.Get("confirm") != id {
		return badInput("type the allocation ID %s to confirm the release", id)
	}
	idx, err := q.api.send(http.MethodPost, "/v1/allocations/"+esc(id)+"/release", nil, nil, nil)
	if err != nil {
		return err
	}
	return q.redirect(Prefix+"allocations/"+esc(id), idx, "release requested: the VM stops, its disks are wiped and verified")
}

func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
