//! The robot's MJCF as ProtoMotions' MuJoCo loop loads it
//! (`test_tracker_mujoco.py`'s `_patch_mjcf_xml`, after
//! `MujocoSimulator._load_mjcf_stripped`): `<sensor>` sections dropped (they
//! may name sites the file lacks), a ground plane and a light added to the
//! world body when it has none.
//!
//! Done on the XML's events (quick-xml) rather than through MuJoCo's model
//! editing API, so that the patch needs no simulator and is tested without
//! one; the rest of the document passes through untouched.

use quick_xml::events::{BytesEnd, BytesStart, Event};
use quick_xml::{Reader, Writer};

use crate::error::{Result, SimError};

/// What the patch changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Patched {
    /// `<sensor>` sections removed (children of the root).
    pub sensors_removed: usize,
    /// A ground plane was added (the world body had no geom named like a
    /// floor or ground, and no plane).
    pub floor_added: bool,
    /// A light was added (the world body had none).
    pub light_added: bool,
}

/// `xml` patched as ProtoMotions patches it; `file` names it in errors.
pub fn patch(xml: &str, file: &str) -> Result<(String, Patched)> {
    let world = scan_world(xml, file)?;
    let mut patched = Patched { floor_added: !world.has_ground, light_added: !world.has_light, ..Patched::default() };
    let mut reader = Reader::from_str(xml);
    let mut writer = Writer::new(Vec::with_capacity(xml.len() + 256));
    let bad = |e: &dyn std::fmt::Display, at: u64| SimError::Mjcf {
        file: file.to_owned(),
        reason: format!("{e} (byte {at})"),
    };
    let mut depth = 0usize;
    // depth of a <sensor> being skipped, and whether the first worldbody was met
    let mut skipping: Option<usize> = None;
    let mut world_done = false;
    loop {
        let at = reader.buffer_position();
        let event = reader.read_event().map_err(|e| bad(&e, at))?;
        if let Some(d) = skipping {
            match &event {
                Event::Start(_) => depth += 1,
                Event::End(_) => {
                    depth -= 1;
                    if depth == d {
                        skipping = None;
                    }
                }
                Event::Eof => return Err(bad(&"the document ends inside <sensor>", at)),
                _ => {}
            }
            continue;
        }
        match event {
            Event::Eof => break,
            Event::Start(e) => {
                if depth == 1 && e.name().as_ref() == "sensor" {
                    patched.sensors_removed += 1;
                    skipping = Some(depth);
                    depth += 1;
                    continue;
                }
                depth += 1;
                writer.write_event(Event::Start(e)).map_err(|e| bad(&e, at))?;
            }
            Event::Empty(e) if depth == 1 && e.name().as_ref() == "sensor" => patched.sensors_removed += 1,
            Event::Empty(e) if depth == 1 && e.name().as_ref() == "worldbody" && !world_done => {
                world_done = true;
                writer.write_event(Event::Start(e.to_owned())).map_err(|e| bad(&e, at))?;
                write_additions(&mut writer, patched).map_err(|e| bad(&e, at))?;
                writer.write_event(Event::End(BytesEnd::new("worldbody"))).map_err(|e| bad(&e, at))?;
            }
            Event::End(e) => {
                depth = depth.saturating_sub(1);
                if depth == 1 && e.name().as_ref() == "worldbody" && !world_done {
                    world_done = true;
                    write_additions(&mut writer, patched).map_err(|e| bad(&e, at))?;
                }
                writer.write_event(Event::End(e)).map_err(|e| bad(&e, at))?;
            }
            other => writer.write_event(other).map_err(|e| bad(&e, at))?,
        }
    }
    if !world_done {
        // ProtoMotions adds nothing then; MuJoCo will say what is missing
        patched.floor_added = false;
        patched.light_added = false;
    }
    let text = String::from_utf8(writer.into_inner()).map_err(|e| bad(&e, 0))?;
    Ok((text, patched))
}

/// The world body's direct children: is there a ground, a light?
struct World {
    has_ground: bool,
    has_light: bool,
}

fn scan_world(xml: &str, file: &str) -> Result<World> {
    let mut reader = Reader::from_str(xml);
    let mut depth = 0usize;
    let mut in_world = false;
    let mut seen_world = false;
    let mut world = World { has_ground: false, has_light: false };
    loop {
        let at = reader.buffer_position();
        let event = reader
            .read_event()
            .map_err(|e| SimError::Mjcf { file: file.to_owned(), reason: format!("{e} (byte {at})") })?;
        match event {
            Event::Eof => break,
            Event::Start(e) => {
                if depth == 1 && e.name().as_ref() == "worldbody" && !seen_world {
                    in_world = true;
                    seen_world = true;
                } else if in_world && depth == 2 {
                    child(&e, &mut world);
                }
                depth += 1;
            }
            Event::Empty(e) => {
                if depth == 1 && e.name().as_ref() == "worldbody" {
                    seen_world = true;
                } else if in_world && depth == 2 {
                    child(&e, &mut world);
                }
            }
            Event::End(_) => {
                depth = depth.saturating_sub(1);
                if depth == 1 {
                    in_world = false;
                }
            }
            _ => {}
        }
    }
    Ok(world)
}

/// A direct child of the world body: `geom` whose name holds "floor" or
/// "ground" (any case) or whose type is a plane; `light`.
fn child(e: &BytesStart<'_>, world: &mut World) {
    match e.name().as_ref() {
        "geom" => {
            let attr = |key: &str| {
                e.attributes()
                    .flatten()
                    .find(|a| a.key.as_ref() == key)
                    .map(|a| a.value.to_lowercase())
                    .unwrap_or_default()
            };
            let name = attr("name");
            if name.contains("floor") || name.contains("ground") || attr("type") == "plane" {
                world.has_ground = true;
            }
        }
        "light" => world.has_light = true,
        _ => {}
    }
}

/// The ground and light ProtoMotions adds, at the end of the world body.
fn write_additions(w: &mut Writer<Vec<u8>>, p: Patched) -> std::io::Result<()> {
    if p.floor_added {
        let floor = BytesStart::new("geom").with_attributes([
            ("name", "floor"),
            ("type", "plane"),
            ("size", "0 0 0.05"),
            ("rgba", "0.7 0.7 0.7 1"),
        ]);
        w.write_event(Event::Empty(floor))?;
    }
    if p.light_added {
        let light = BytesStart::new("light").with_attributes([
            ("pos", "2 0 5.0"),
            ("dir", "0 0 -1"),
            ("diffuse", "0.4 0.4 0.4"),
            ("specular", "0.1 0.1 0.1"),
            ("directional", "true"),
        ]);
        w.write_event(Event::Empty(light))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROBOT: &str = r#"<mujoco model="r">
  <option timestep="0.002"/>
  <worldbody>
    <body name="pelvis" pos="0 0 1"><freejoint/><geom type="box" size=".1 .1 .1"/>
      <body name="leg"><joint name="hip" axis="0 1 0"/><geom name="ground_probe_not_world" type="capsule" size=".02" fromto="0 0 0 0 0 -.4"/></body>
    </body>
  </worldbody>
  <actuator><motor joint="hip"/></actuator>
  <sensor><framequat objtype="site" objname="missing"/></sensor>
  <sensor/>
</mujoco>"#;

    #[test]
    fn sensors_dropped_floor_and_light_added_once() {
        let (xml, p) = patch(ROBOT, "robot.xml").expect("patch");
        assert_eq!(p, Patched { sensors_removed: 2, floor_added: true, light_added: true });
        assert!(!xml.contains("sensor") && !xml.contains("framequat"), "{xml}");
        assert_eq!(xml.matches("name=\"floor\" type=\"plane\"").count(), 1, "{xml}");
        assert_eq!(xml.matches("<light ").count(), 1, "{xml}");
        // the additions are the world body's last children, the robot untouched
        let world_end = xml.find("</worldbody>").expect("worldbody");
        assert!(xml.find("name=\"floor\"").is_some_and(|i| i < world_end && i > xml.find("</body>\n  ").unwrap_or(0)));
        assert!(xml.contains(r#"<motor joint="hip"/>"#) && xml.contains(r#"<option timestep="0.002"/>"#));
        // patching twice changes nothing more
        let (again, p2) = patch(&xml, "robot.xml").expect("patch again");
        assert_eq!(p2, Patched::default());
        assert_eq!(again, xml);
    }

    #[test]
    fn an_existing_ground_or_light_is_kept_as_the_only_one() {
        for ground in [r#"<geom name="Floor" type="box" size="1 1 .1"/>"#, r#"<geom type="plane" size="0 0 1"/>"#] {
            let xml = format!("<mujoco><worldbody>{ground}<light pos='0 0 3'/></worldbody></mujoco>");
            let (out, p) = patch(&xml, "x.xml").expect("patch");
            assert_eq!(p, Patched::default(), "{ground}");
            assert_eq!(out, xml);
        }
        // a geom named like a floor inside a body is not the world's ground
        let (_, p) = patch(ROBOT, "robot.xml").expect("patch");
        assert!(p.floor_added);
        // an empty world body gets both
        let (out, p) = patch("<mujoco><worldbody/></mujoco>", "x.xml").expect("patch");
        assert!(p.floor_added && p.light_added);
        assert!(
            out.starts_with("<mujoco><worldbody><geom name=\"floor\"") && out.ends_with("</worldbody></mujoco>"),
            "{out}"
        );
    }

    #[test]
    fn broken_xml_is_an_error_naming_the_file() {
        let e = patch("<mujoco><worldbody></mujoco>", "bad.xml").expect_err("mismatched tags");
        assert!(e.to_string().contains("bad.xml"), "{e}");
        let e = patch("<mujoco><sensor><x>", "cut.xml").expect_err("cut inside sensor");
        assert!(e.to_string().contains("cut.xml"), "{e}");
    }
}
