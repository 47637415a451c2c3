package maassim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// ---------------------------------------------------------------------------
// nodes/{system_id}/blockdevices/

func (s *Server) blockDevices(c *reqCtx, systemID string, rest []string) (*response, error) {
	m, ok := s.machines[systemID]
	if !ok {
		return nil, notFound("Machine")
	}
	if len(rest) == 0 {
		if c.method == http.MethodGet && c.op == "" {
			out := []any{}
			for _, d := range m.disks {
				out = append(out, blockDeviceJSON(m, d))
			}
			return jsonResponse(out), nil
		}
		return nil, unknownOp(c)
	}
	if len(rest) != 1 {
		return nil, notFound("BlockDevice")
	}
	var d *blockDevice
	for _, x := range m.disks {
		if strconv.Itoa(x.id) == rest[0] || x.name == rest[0] {
			d = x
		}
	}
	if d == nil {
		return nil, notFound("BlockDevice")
	}
	switch {
	case c.method == http.MethodGet && c.op == "":
		return jsonResponse(blockDeviceJSON(m, d)), nil
	case c.method == http.MethodPost && c.op == "set_boot_disk":
		if m.status != StatusReady {
			return nil, stateViolation("Cannot set as boot disk because the machine is not Ready.")
		}
		m.bootDiskID = d.id
		return textResponse(http.StatusOK, "OK"), nil
	}
	return nil, unknownOp(c)
}

// ---------------------------------------------------------------------------
// nodes/{system_id}/interfaces/

func (s *Server) interfaces(c *reqCtx, systemID string, rest []string) (*response, error) {
	m, ok := s.machines[systemID]
	if !ok {
		return nil, notFound("Machine")
	}
	if len(rest) == 0 {
		if c.method == http.MethodGet && c.op == "" {
			out := []any{}
			for _, i := range m.ifaces {
				out = append(out, s.ifaceJSON(m, i))
			}
			return jsonResponse(out), nil
		}
		return nil, unknownOp(c)
	}
	var i *iface
	for _, x := range m.ifaces {
		if len(rest) == 1 && (strconv.Itoa(x.id) == rest[0] || x.name == rest[0]) {
			i = x
		}
	}
	if i == nil {
		return nil, notFound("Interface")
	}
	var err error
	switch {
	case c.method == http.MethodGet && c.op == "":
		return jsonResponse(s.ifaceJSON(m, i)), nil
	case c.method == http.MethodPost && c.op == "link_subnet":
		err = s.linkSubnet(c, m, i)
	case c.method == http.MethodPost && c.op == "unlink_subnet":
		err = s.unlinkSubnet(c, m, i)
	default:
		return nil, unknownOp(c)
	}
	if err != nil {
		return nil, err
	}
	return jsonResponse(s.ifaceJSON(m, i)), nil
}

// ---------------------------------------------------------------------------
// tags/

type tag struct {
	name, comment, definition, kernelOpts string
}

func tagJSON(t *tag) map[string]any {
	return map[string]any{"name": t.name, "comment": t.comment, "definition": t.definition,
		"kernel_opts": t.kernelOpts, "resource_uri": fmt.Sprintf("%stags/%s/", APIPrefix, t.name)}
}

var tagNameRE = regexp.MustCompile(`^[\w-]+$`)

func (s *Server) tagsCollection(c *reqCtx) (*response, error) {
	switch {
	case c.method == http.MethodGet && c.op == "":
		names := make([]string, 0, len(s.tags))
		for n := range s.tags {
			names = append(names, n)
		}
		sort.Strings(names)
		out := []any{}
		for _, n := range names {
			out = append(out, tagJSON(s.tags[n]))
		}
		return jsonResponse(out), nil
	case c.method == http.MethodPost && c.op == "":
		name := c.get("name")
		if name == "" {
			return nil, fieldError("name", "This field is required.")
		}
		if !tagNameRE.MatchString(name) {
			return nil, fieldError("name", "Invalid character in the tag name.")
		}
		if _, dup := s.tags[name]; dup {
			return nil, fieldError("name", "Tag with this Name already exists.")
		}
		t := &tag{name: name, comment: c.get("comment"), definition: c.get("definition"), kernelOpts: c.get("kernel_opts")}
		s.tags[name] = t
		return jsonResponse(tagJSON(t)), nil
	}
	return nil, unknownOp(c)
}

func (s *Server) tagResource(c *reqCtx, name string) (*response, error) {
	t, ok := s.tags[name]
	if !ok {
		return nil, notFound("Tag")
	}
	switch {
	case c.method == http.MethodGet && c.op == "":
		return jsonResponse(tagJSON(t)), nil
	case c.method == http.MethodGet && c.op == "machines":
		out := []any{}
		for _, id := range s.order {
			if m := s.machines[id]; slices.Contains(m.tags, name) {
				out = append(out, s.machineJSON(m))
			}
		}
		return jsonResponse(out), nil
	case c.method == http.MethodDelete:
		delete(s.tags, name)
		for _, m := range s.machines {
			m.tags = slices.DeleteFunc(m.tags, func(x string) bool { return x == name })
		}
		return &response{status: http.StatusNoContent, ctype: "text/plain; charset=utf-8"}, nil
	case c.method == http.MethodPost && c.op == "update_nodes":
		if t.definition != "" {
			return nil, badRequest("Cannot update nodes of tag '%s': it has a definition.", name)
		}
		added, removed := 0, 0
		for _, id := range c.form["add"] {
			if m, ok := s.machines[id]; ok && !slices.Contains(m.tags, name) {
				m.tags = append(m.tags, name)
				sort.Strings(m.tags)
				added++
			}
		}
		for _, id := range c.form["remove"] {
			if m, ok := s.machines[id]; ok && slices.Contains(m.tags, name) {
				m.tags = slices.DeleteFunc(m.tags, func(x string) bool { return x == name })
				removed++
			}
		}
		return jsonResponse(map[string]int{"added": added, "removed": removed}), nil
	}
	return nil, unknownOp(c)
}

// ---------------------------------------------------------------------------
// events/?op=query (maasserver/api/events.py)

const (
	defaultEventLimit = 100
	maxEventLimit     = 1000
)

func (s *Server) eventsQuery(c *reqCtx) (*response, error) {
	intParam := func(k string) (int, bool, *apiError) {
		v := c.get(k)
		if v == "" {
			return 0, false, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return 0, false, badRequest("Invalid %s: Please enter an integer value.", k)
		}
		return n, true, nil
	}
	after, hasAfter, err := intParam("after")
	if err != nil {
		return nil, err
	}
	before, hasBefore, err := intParam("before")
	if err != nil {
		return nil, err
	}
	limit, hasLimit, err := intParam("limit")
	if err != nil {
		return nil, err
	}
	if !hasLimit {
		limit = defaultEventLimit
	}
	if limit > maxEventLimit {
		return nil, badRequest("Requested number of events %d is greater than limit: %d", limit, maxEventLimit)
	}
	if limit < 1 {
		limit = 1
	}
	levelName := strings.ToUpper(c.get("level"))
	if levelName == "" {
		levelName = "INFO"
	}
	minLevel := -1
	for l, n := range levelNames {
		if n == levelName {
			minLevel = l
		}
	}
	if minLevel < 0 {
		return nil, badRequest("Unrecognised log level: %s", c.get("level"))
	}
	if hasAfter && hasBefore {
		return nil, badRequest("There is undetermined behaviour when both `after` and `before` are specified.")
	}
	var macs []string
	for _, raw := range c.form["mac_address"] {
		n, err := normalizeMAC(raw)
		if err != nil {
			return nil, badRequest("Invalid MAC address(es): %s", raw)
		}
		macs = append(macs, n)
	}
	nodeMatch := func(e *Event) bool {
		m := s.machines[e.SystemID]
		if v := c.form["id"]; len(v) > 0 && !slices.Contains(v, e.SystemID) {
			return false
		}
		if v := c.form["hostname"]; len(v) > 0 && !slices.Contains(v, e.Hostname) && (m == nil || !slices.Contains(v, m.hostname)) {
			return false
		}
		if len(macs) > 0 && (m == nil || !slices.ContainsFunc(m.ifaces, func(i *iface) bool { return slices.Contains(macs, i.mac) })) {
			return false
		}
		return true
	}
	var sel []*Event
	for _, e := range s.events {
		if minLevel == levelAudit {
			if e.level != levelAudit {
				continue
			}
		} else if e.level < minLevel || !nodeMatch(e) {
			continue
		}
		if hasAfter && e.ID <= after || hasBefore && e.ID >= before {
			continue
		}
		sel = append(sel, e)
	}
	if hasAfter {
		// Oldest first after `after`, limited, then newest first.
		if len(sel) > limit {
			sel = sel[:limit]
		}
		slices.Reverse(sel)
	} else {
		slices.Reverse(sel)
		if len(sel) > limit {
			sel = sel[:limit]
		}
	}
	base := c.form
	mk := func(drop, key string, val int) string {
		q := url.Values{}
		for k, v := range base {
			if k == drop || k == "after" || k == "before" {
				continue
			}
			q[k] = v
		}
		q.Set("op", "query")
		q.Set(key, strconv.Itoa(val))
		return APIPrefix + "events/?" + q.Encode()
	}
	var next, prev any
	switch {
	case len(sel) > 0:
		next = mk("before", "after", sel[0].ID)
		prev = mk("after", "before", sel[len(sel)-1].ID)
	case hasBefore:
		next = mk("before", "after", before-1)
	case hasAfter:
		next = mk("before", "after", after)
		prev = mk("after", "before", after+1)
	default:
		next = mk("before", "after", 0)
	}
	evs := []any{}
	for _, e := range sel {
		evs = append(evs, map[string]any{
			"username": e.Username, "node": e.SystemID, "hostname": e.Hostname, "id": e.ID,
			"level": e.Level, "created": e.Created.UTC().Format("Mon, 02 Jan. 2006 15:04:05"),
			"type": e.Type, "description": e.Description,
		})
	}
	return jsonResponse(map[string]any{"count": len(sel), "events": evs, "next_uri": next, "prev_uri": prev}), nil
}

// ---------------------------------------------------------------------------
// boot-resources/

type bootResource struct {
	id           int
	name         string
	title        string
	architecture string
	baseImage    string
	sets         []*bootSet
}

type bootSet struct {
	version  string
	filetype string // upload filetype (tgz, ddgz, ...)
	filename string // MAAS file type name (root-tgz, root-dd.gz, ...)
	sha256   string
	size     int64
}

// uploadFileTypes maps the filetype an upload names to the boot-resource
// file MAAS stores (BOOT_RESOURCE_FILE_TYPE): tgz/tbz/txz are root
// filesystem archives MAAS partitions itself; dd* are whole-disk images.
var uploadFileTypes = map[string]string{
	"tgz": "root-tgz", "tbz": "root-tbz", "txz": "root-txz",
	"ddtgz": "root-dd", "ddtbz": "root-dd.tar.bz2", "ddtxz": "root-dd.tar.xz",
	"ddtar": "root-dd.tar", "ddbz2": "root-dd.bz2", "ddgz": "root-dd.gz",
	"ddxz": "root-dd.xz", "ddraw": "root-dd.raw",
}

// BootResourceSnapshot describes an uploaded image.
type BootResourceSnapshot struct {
	ID           int
	Name         string
	Architecture string
	FileType     string // tgz, ddgz...
	File         string // root-tgz, root-dd.gz...
	SHA256       string
	Size         int64
}

// BootResources lists uploaded images (latest set of each).
func (s *Server) BootResources() []BootResourceSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []BootResourceSnapshot
	for _, r := range s.resources {
		set := r.sets[len(r.sets)-1]
		out = append(out, BootResourceSnapshot{ID: r.id, Name: r.name, Architecture: r.architecture,
			FileType: set.filetype, File: set.filename, SHA256: set.sha256, Size: set.size})
	}
	return out
}

func bootResourceJSON(r *bootResource, withSets bool) map[string]any {
	out := map[string]any{
		"id": r.id, "type": "Uploaded", "name": r.name, "architecture": r.architecture,
		"resource_uri": fmt.Sprintf("%sboot-resources/%d/", APIPrefix, r.id),
	}
	if r.title != "" {
		out["title"] = r.title
	}
	if r.baseImage != "" {
		out["base_image"] = r.baseImage
	}
	if withSets {
		sets := map[string]any{}
		for _, st := range r.sets {
			sets[st.version] = map[string]any{
				"version": st.version, "label": "uploaded", "size": st.size, "complete": true,
				"files": map[string]any{st.filename: map[string]any{
					"filename": st.filename, "filetype": st.filename, "sha256": st.sha256,
					"size": st.size, "complete": true,
				}},
			}
		}
		out["sets"] = sets
		out["subarches"] = "generic"
	}
	return out
}

func (s *Server) bootResourcesCollection(c *reqCtx) (*response, error) {
	switch {
	case c.method == http.MethodGet && c.op == "":
		typ := strings.ToLower(c.get("type"))
		out := []any{}
		if typ == "" || typ == "all" || typ == "uploaded" {
			for _, r := range s.resources {
				out = append(out, bootResourceJSON(r, false))
			}
		}
		return jsonResponse(out), nil
	case c.method == http.MethodPost && c.op == "":
		return s.uploadBootResource(c)
	}
	return nil, unknownOp(c)
}

func (s *Server) uploadBootResource(c *reqCtx) (*response, error) {
	name := c.get("name")
	if name == "" {
		return nil, fieldError("name", "This field is required.")
	}
	arch := c.get("architecture")
	if arch == "" {
		return nil, fieldError("architecture", "This field is required.")
	}
	if !slices.Contains(validArchitectures, arch) {
		return nil, invalidChoice("architecture", arch, validArchitectures)
	}
	ft := c.get("filetype")
	if ft == "" {
		ft = "tgz"
	}
	file, ok := uploadFileTypes[ft]
	if !ok {
		return nil, fieldError("filetype", "Select a valid choice. %s is not one of the available choices.", ft)
	}
	content, ok := c.files["content"]
	if !ok {
		return nil, fieldError("content", "This field is required.")
	}
	sum := sha256.Sum256(content)
	digest := hex.EncodeToString(sum[:])
	if want := strings.ToLower(c.get("sha256")); want != "" && want != digest {
		return nil, fieldError("sha256", "SHA256 of the content (%s) does not match the given sha256.", digest)
	}
	if v := c.get("size"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err != nil || n != int64(len(content)) {
			return nil, fieldError("size", "Size of the content (%d) does not match the given size.", len(content))
		}
	}
	var r *bootResource
	for _, x := range s.resources {
		if x.name == name && x.architecture == arch {
			r = x
		}
	}
	if r == nil {
		r = &bootResource{id: len(s.resources) + 1, name: name, architecture: arch}
		s.resources = append(s.resources, r)
	}
	r.title, r.baseImage = c.get("title"), c.get("base_image")
	version := s.clock.Now().UTC().Format("20060102") + "." + strconv.Itoa(len(r.sets))
	r.sets = append(r.sets, &bootSet{version: version, filetype: ft, filename: file, sha256: digest, size: int64(len(content))})
	resp := jsonResponse(bootResourceJSON(r, true))
	resp.status = http.StatusCreated
	return resp, nil
}

func (s *Server) bootResource(c *reqCtx, idStr string) (*response, error) {
	id, _ := strconv.Atoi(idStr)
	idx := slices.IndexFunc(s.resources, func(r *bootResource) bool { return r.id == id })
	if idx < 0 {
		return nil, notFound("BootResource")
	}
	switch {
	case c.method == http.MethodGet && c.op == "":
		return jsonResponse(bootResourceJSON(s.resources[idx], true)), nil
	case c.method == http.MethodDelete:
		s.resources = slices.Delete(s.resources, idx, idx+1)
		return &response{status: http.StatusNoContent, ctype: "text/plain; charset=utf-8"}, nil
	}
	return nil, unknownOp(c)
}
