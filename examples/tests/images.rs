//! The container images: the Dockerfiles under `deploy/images/` (each names its image on a `# image: NAME:TAG`
//! line, which `scripts/build-images.sh` builds it as) and the Kubernetes manifests under `deploy/kubernetes/`
//! must agree on the image names, and the tags must be the workspace's version. Cheap: reads files only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn files(dir: &str, suffix: &str) -> Vec<(PathBuf, String)> {
    let dir = repo().join(dir);
    let mut found: Vec<(PathBuf, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.to_string_lossy().ends_with(suffix))
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (path, text)
        })
        .collect();
    found.sort();
    found
}

/// Image name -> Dockerfile text, from each Dockerfile's `# image:` line.
fn dockerfile_images() -> Vec<(String, PathBuf, String)> {
    files("deploy/images", ".Dockerfile")
        .into_iter()
        .map(|(path, text)| {
            let image = text
                .lines()
                .find_map(|l| l.strip_prefix("# image:"))
                .unwrap_or_else(|| panic!("{} has no `# image: NAME:TAG` line", path.display()))
                .trim()
                .to_owned();
            (image, path, text)
        })
        .collect()
}

/// Every `image:` of the manifests.
fn manifest_images() -> BTreeSet<String> {
    let mut images = BTreeSet::new();
    for (_, text) in files("deploy/kubernetes", ".yaml") {
        for line in text.lines() {
            let line = line.trim_start().trim_start_matches("- ");
            if let Some(image) = line.strip_prefix("image:") {
                images.insert(image.trim().trim_matches('"').to_owned());
            }
        }
    }
    images
}

#[test]
fn the_dockerfiles_build_exactly_the_images_the_manifests_run() {
    let built: BTreeSet<String> = dockerfile_images().into_iter().map(|(image, _, _)| image).collect();
    let run = manifest_images();
    assert!(!run.is_empty(), "the manifests name no image");
    assert_eq!(
        built, run,
        "deploy/images/*.Dockerfile (`# image:` lines) and deploy/kubernetes/*.yaml (`image:`) disagree"
    );
}

#[test]
fn image_tags_are_the_workspace_version() {
    for (image, path, _) in dockerfile_images() {
        let (_, tag) = image
            .rsplit_once(':')
            .unwrap_or_else(|| panic!("{}: image {image} has no tag", path.display()));
        assert_eq!(tag, env!("CARGO_PKG_VERSION"), "{}: tag of {image}", path.display());
    }
}

#[test]
fn each_dockerfile_is_multi_stage_non_root_and_builds_the_binary_it_runs() {
    let images = dockerfile_images();
    assert!(images.len() >= 2, "a coordinator and a worker Dockerfile: {images:?}");
    for (image, path, text) in images {
        let at = path.display();
        let froms = text.lines().filter(|l| l.starts_with("FROM ")).count();
        assert!(froms >= 2, "{at}: a build stage and a runtime stage ({froms} FROM)");
        let user = text
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("USER "))
            .unwrap_or_else(|| panic!("{at}: no USER: the image would run as root"));
        assert!(
            !user.trim().starts_with("root") && !user.trim().starts_with('0'),
            "{at}: runs as {user}"
        );
        let entrypoint = text
            .lines()
            .find_map(|l| l.strip_prefix("ENTRYPOINT [\"/usr/local/bin/"))
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("{at}: no ENTRYPOINT [\"/usr/local/bin/<binary>\"]"));
        assert!(
            text.contains(&format!("--bin {entrypoint} ")),
            "{at} ({image}): the build stage must build the binary the image runs ({entrypoint})"
        );
    }
    let script = std::fs::read_to_string(repo().join("scripts/build-images.sh")).expect("scripts/build-images.sh");
    assert!(
        script.contains("deploy/images/*.Dockerfile") && script.contains("# image:"),
        "scripts/build-images.sh builds every deploy/images/*.Dockerfile under its `# image:` name"
    );
}
