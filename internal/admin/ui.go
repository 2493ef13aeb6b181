package admin

import (
	"embed"
	"io/fs"
	"net/http"
)

// uiFiles is the dashboard: one HTML page with its script and styles, no external assets, so it
// works with no network and no CDN.
//
//go:embed ui
var uiFiles embed.FS

// uiHandler serves the dashboard under /ui/.
func uiHandler() http.Handler {
	sub, _ := fs.Sub(uiFiles, "ui")
	files := http.StripPrefix("/ui/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		files.ServeHTTP(w, r)
	})
}
