package ui

import (
	"fmt"
	"html/template"
	"io/fs"
	"path"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

var funcs = template.FuncMap{
	"bytes": templateBytes,
	"time": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"timep": func(t *time.Time) string {
		if t == nil {
			return ""
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"join": strings.Join,
	"nodeStates": func() []proto.NodeState {
		return []proto.NodeState{proto.NodeRegistered, proto.NodeActive, proto.NodeUnreachable, proto.NodeDisabled}
	},
	"slotActions": func(v view, s *proto.Slot) slotActionsData {
		back := Prefix + "slots/" + esc(s.ID)
		if v.req != nil {
			back = v.r.URL.Path
		}
		return slotActionsData{V: v, Slot: s, Back: back}
	},
	"breakerCard": func(v view, b breakerView, node string) map[string]any {
		back := Prefix + "nodes/" + esc(node)
		if v.req != nil {
			back = v.r.URL.Path
		}
		return map[string]any{"V": v, "B": b, "Node": node, "Back": back}
	},
	"allocStates":    func() []proto.AllocState { return proto.AllocStates },
	"pct":            func(f float64) string { return fmt.Sprintf("%.2f%%", f) },
	"path":           esc,
	"add":            func(a, b int) int { return a + b },
	"ingressAllowed": ingressAllowed,
	"short": func(s string, n int) string {
		if len(s) <= n {
			return s
		}
		return s[:n] + "…"
	},
}

// parsePages parses every page template with the layout: templates/
// layout.html defines "root", each page defines "content" (and the
// fragments htmx asks for).
func parsePages() (map[string]*template.Template, error) {
	base, err := template.New("layout.html").Funcs(funcs).ParseFS(files, "templates/layout.html", "templates/partials.tmpl")
	if err != nil {
		return nil, fmt.Errorf("ui templates: %w", err)
	}
	names, err := fs.Glob(files, "templates/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		name := strings.TrimSuffix(path.Base(n), ".html")
		if name == "layout" {
			continue
		}
		t, err := base.Clone()
		if err != nil {
			return nil, err
		}
		if t, err = t.ParseFS(files, n); err != nil {
			return nil, fmt.Errorf("ui template %s: %w", n, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// slotActionsData is what the "slotactions" template gets.
type slotActionsData struct {
	V    view
	Slot *proto.Slot
	Back string
}

// templateBytes is the templates' bytes function: a byte count of any
// integer type the API's types use (slot disks are uint64, image and app
// sizes int64), human-readable. A negative count or another type is an
// error, so a template that passes one fails its render instead of
// printing a wrong size.
func templateBytes(v any) (string, error) {
	switch n := v.(type) {
	case uint64:
		return humanBytes(n), nil
	case uint32:
		return humanBytes(uint64(n)), nil
	case uint:
		return humanBytes(uint64(n)), nil
	case int64:
		if n >= 0 {
			return humanBytes(uint64(n)), nil
		}
	case int32:
		if n >= 0 {
			return humanBytes(uint64(n)), nil
		}
	case int:
		if n >= 0 {
			return humanBytes(uint64(n)), nil
		}
	default:
		return "", fmt.Errorf("bytes: %T is not a byte count", v)
	}
	return "", fmt.Errorf("bytes: negative byte count %v", v)
}
