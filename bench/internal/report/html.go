package report

import (
	_ "embed"
	"html/template"
	"io"
)

//go:embed report.html.tmpl
var htmlTemplate string

//go:embed charts.js
var chartsJS string

var page = template.Must(template.New("report").Funcs(template.FuncMap{
	"pct": func(n, total int64) float64 {
		if total == 0 {
			return 0
		}
		return 100 * float64(n) / float64(total)
	},
}).Parse(htmlTemplate))

// WriteHTML writes a self-contained page: inline CSS, inline script that
// draws the charts as SVG from the embedded data; nothing is fetched.
func (r *Report) WriteHTML(w io.Writer) error {
	var total int64
	for _, m := range r.Mix {
		total += m.Count
	}
	return page.Execute(w, struct {
		R        *Report
		Total    int64
		ChartsJS template.JS
	}{r, total, template.JS(chartsJS)})
}
