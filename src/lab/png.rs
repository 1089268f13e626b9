//! PNG plots without a font engine. plotters draws text on a bitmap only
//! through a font rasterizer (its `ttf` feature links the system's
//! fontconfig and freetype), so the build would need system libraries. A
//! PNG is drawn through [`Textless`] instead: every shape as the bitmap
//! backend draws it, text left out (the SVG beside it, whose `<text>`
//! elements the viewer renders, carries the labels). Layout still measures
//! text with plotters' built-in estimate, so both files share one layout.

use plotters::prelude::BitMapBackend;
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
};
use std::path::Path;

/// A bitmap backend that draws no text.
pub struct Textless<'a>(BitMapBackend<'a>);

impl<'a> Textless<'a> {
    /// A `size` PNG written to `path` when presented.
    pub fn new(path: &'a Path, size: (u32, u32)) -> Textless<'a> {
        Textless(BitMapBackend::new(path, size))
    }
}

type Drawn<'a> = Result<(), DrawingErrorKind<<BitMapBackend<'a> as DrawingBackend>::ErrorType>>;

impl<'a> DrawingBackend for Textless<'a> {
    type ErrorType = <BitMapBackend<'a> as DrawingBackend>::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.0.get_size()
    }

    fn ensure_prepared(&mut self) -> Drawn<'a> {
        self.0.ensure_prepared()
    }

    fn present(&mut self) -> Drawn<'a> {
        self.0.present()
    }

    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> Drawn<'a> {
        self.0.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Drawn<'a> {
        self.0.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Drawn<'a> {
        self.0.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Drawn<'a> {
        self.0.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Drawn<'a> {
        self.0.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Drawn<'a> {
        self.0.fill_polygon(vert, style)
    }

    /// Text is left out (see the module comment).
    fn draw_text<T: BackendTextStyle>(&mut self, _: &str, _: &T, _: BackendCoord) -> Drawn<'a> {
        Ok(())
    }

    fn blit_bitmap(&mut self, pos: BackendCoord, size: (u32, u32), src: &[u8]) -> Drawn<'a> {
        self.0.blit_bitmap(pos, size, src)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plotters::prelude::*;

    #[test]
    fn a_chart_with_text_is_drawn_without_a_font_engine() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.png");
        {
            let root = Textless::new(&path, (200, 120)).into_drawing_area();
            root.fill(&WHITE).unwrap();
            let root = root.titled("a title", ("sans-serif", 20)).unwrap();
            let mut chart = ChartBuilder::on(&root)
                .caption("caption", ("sans-serif", 14))
                .x_label_area_size(20)
                .y_label_area_size(20)
                .build_cartesian_2d(0.0..1.0, 0.0..1.0)
                .unwrap();
            chart.configure_mesh().x_desc("x").draw().unwrap();
            chart
                .draw_series(LineSeries::new([(0.0, 0.0), (1.0, 1.0)], RED))
                .unwrap();
            root.present().unwrap();
        }
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 100);
    }
}
