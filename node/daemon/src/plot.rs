//! Small SVG line charts (no plotting dependency): the demo's loss curve and the convergence
//! benchmark's comparison of runs.

/// One named line.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

const COLORS: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// A line chart of `series` with a title, axis labels and (for more than one series) a legend.
pub fn line_chart(title: &str, x_label: &str, series: &[Series]) -> String {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let (w, h, m) = (760.0, 460.0, 60.0);
    let legend_w = if series.len() > 1 { 170.0 } else { 0.0 };
    let xmax = all().map(|p| p.0).fold(1.0, f64::max);
    let ymin = all().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let ymax = all().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let (ymin, ymax) = if !ymin.is_finite() || (ymax - ymin).abs() < 1e-9 {
        (ymin - 0.5, ymin + 0.5)
    } else {
        (ymin, ymax)
    };
    let sx = |x: f64| m + x / xmax * (w - 2.0 * m - legend_w);
    let sy = |y: f64| h - m - (y - ymin) / (ymax - ymin) * (h - 2.0 * m);
    let right = w - m - legend_w;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">{title}</text>\n\
         <line x1=\"{m}\" y1=\"{}\" x2=\"{right}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{}\" stroke=\"black\"/>\n",
        w / 2.0,
        h - m,
        h - m,
        h - m
    );
    for i in 0..=4 {
        let y = ymin + (ymax - ymin) * i as f64 / 4.0;
        s += &format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{y:.3}</text>\n",
            m - 6.0,
            sy(y) + 4.0
        );
        let x = xmax * i as f64 / 4.0;
        s += &format!(
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{x:.0}</text>\n",
            sx(x),
            h - m + 18.0
        );
    }
    s += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{x_label}</text>\n",
        (m + right) / 2.0,
        h - 12.0
    );
    s += &format!(
        "<text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">validation loss</text>\n",
        h / 2.0,
        h / 2.0
    );
    for (i, se) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let line: Vec<String> = se
            .points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
            .collect();
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>\n",
            line.join(" ")
        );
        if se.points.len() <= 30 {
            for (x, y) in &se.points {
                s += &format!(
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"/>\n",
                    sx(*x),
                    sy(*y)
                );
            }
        }
        if series.len() > 1 {
            let ly = m + 16.0 * i as f64;
            s += &format!(
                "<line x1=\"{}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{c}\" stroke-width=\"3\"/><text x=\"{}\" y=\"{}\">{}</text>\n",
                right + 12.0,
                right + 30.0,
                right + 36.0,
                ly + 4.0,
                se.name
            );
        }
    }
    s + "</svg>\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_draws_every_series_and_names_them() {
        let s = line_chart(
            "t",
            "step",
            &[
                Series {
                    name: "single".into(),
                    points: vec![(0.0, 4.0), (10.0, 3.0)],
                },
                Series {
                    name: "diloco".into(),
                    points: vec![(0.0, 4.0), (10.0, 2.5)],
                },
            ],
        );
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(s.contains("single") && s.contains("diloco"));
    }
}
