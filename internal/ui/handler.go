package ui

import (
	"embed"
	"net/http"
)

//go:embed static
var static embed.FS

// pageHeaders are set on the page and its assets: nothing is loaded from
// elsewhere, nothing is framed or cached, no referrer leaves the page.
var pageHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
		"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
	"X-Content-Type-Options": "nosniff",
	"Referrer-Policy":        "no-referrer",
	"X-Frame-Options":        "DENY",
	"Cache-Control":          "no-store",
}

// Register mounts the dashboard on mux: GET /ui (the page), GET /ui/app.js
// and /ui/app.css (its assets) and GET /admin/events (the event stream).
// The admin API's handler is the usual mux (its Host check then covers the
// dashboard too).
func (d *Dashboard) Register(mux interface{ Handle(string, http.Handler) }) {
	mux.Handle("GET /ui", asset("static/index.html", "text/html; charset=utf-8"))
	mux.Handle("GET /ui/{$}", asset("static/index.html", "text/html; charset=utf-8"))
	mux.Handle("GET /ui/app.js", asset("static/app.js", "text/javascript; charset=utf-8"))
	mux.Handle("GET /ui/app.css", asset("static/app.css", "text/css; charset=utf-8"))
	mux.Handle("GET /admin/events", http.HandlerFunc(d.serveEvents))
}

// asset serves one embedded file.
func asset(name, contentType string) http.HandlerFunc {
	body, err := static.ReadFile(name)
	if err != nil {
		panic("ui: missing embedded " + name) // the build embeds it
	}
	return func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		for k, v := range pageHeaders {
			h.Set(k, v)
		}
		h.Set("Content-Type", contentType)
		_, _ = w.Write(body)
	}
}
