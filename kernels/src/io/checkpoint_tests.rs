//! Tests of checkpoint folders: round trips, damage, atomic replacement, sharded block reads.
use super::*;

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("msl-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn sample() -> Vec<(String, Tensor)> {
    vec![
        ("0.w".to_string(), Tensor::from_f32(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap()),
        ("1.t".to_string(), Tensor::scalar_i32(7)),
        ("1.m".to_string(), Tensor::from_bool(vec![2], vec![true, false]).unwrap()),
        ("2".to_string(), Tensor::from_f64(vec![0], vec![]).unwrap()),
    ]
}

fn wanted(named: &[(String, Tensor)]) -> Vec<Wanted> {
    named
        .iter()
        .map(|(n, t)| Wanted {
            name: n.clone(),
            dtype: t.dtype(),
            shape: t.shape().iter().map(|&d| Some(d)).collect(),
            group: None,
            region: None,
        })
        .collect()
}

#[test]
fn round_trip_is_exact_and_deterministic() {
    let (a, b) = (scratch("a"), scratch("b"));
    let named = sample();
    write_checkpoint(&a, &named).unwrap();
    write_checkpoint(&b, &named).unwrap();
    write_checkpoint(&b, &named).unwrap();
    let back = read_checkpoint(&a, &wanted(&named)).unwrap();
    for ((_, t), u) in named.iter().zip(&back) {
        assert_eq!(t, u);
    }
    let list = |d: &Path| {
        let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(list(&a), list(&b), "the same tensors give the same files");
    assert_eq!(list(&a).len(), 2, "one data file and the index");
    let _ = std::fs::remove_dir_all(&a);
    let _ = std::fs::remove_dir_all(&b);
}

#[test]
fn a_group_is_read_into_one_buffer() {
    let d = scratch("group");
    let named = vec![
        ("w".to_string(), Tensor::from_f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap()),
        ("b".to_string(), Tensor::from_f32(vec![2], vec![5.0, 6.0]).unwrap()),
        ("t".to_string(), Tensor::scalar_i32(3)),
    ];
    write_checkpoint(&d, &named).unwrap();
    let mut w = wanted(&named);
    w[0].group = Some(0);
    w[1].group = Some(0);
    let back = read_checkpoint(&d, &w).unwrap();
    assert_eq!(back.iter().collect::<Vec<_>>(), named.iter().map(|(_, t)| t).collect::<Vec<_>>());
    let joined = back[0].join(&back[1]).expect("w and b are consecutive views of one buffer");
    assert_eq!(joined.as_f32().unwrap(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_new_save_replaces_the_data_file_and_leftovers_go() {
    let d = scratch("replace");
    write_checkpoint(&d, &sample()).unwrap();
    std::fs::write(d.join(".rank0.safetensors.999999999.0.tmp"), b"left by a dead save").unwrap();
    std::fs::write(d.join("notes.txt"), b"the user's").unwrap();
    let other = vec![("x".to_string(), Tensor::scalar_f32(1.5))];
    write_checkpoint(&d, &other).unwrap();
    let mut names: Vec<String> =
        std::fs::read_dir(&d).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.contains(&"notes.txt".to_string()) && names.contains(&INDEX.to_string()), "{names:?}");
    assert_eq!(read_checkpoint(&d, &wanted(&other)).unwrap()[0], other[0].1);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn mismatches_are_named() {
    let d = scratch("mismatch");
    write_checkpoint(&d, &sample()).unwrap();
    let mut w = wanted(&sample());
    w[0].shape = vec![Some(3), None];
    let e = read_checkpoint(&d, &w).unwrap_err().to_string();
    assert!(e.contains("tensor `0.w` is f32 [2, 3] in the checkpoint, but the program expects f32 [3, _]"), "{e}");
    let mut w = wanted(&sample());
    w[1].dtype = DType::F32;
    let e = read_checkpoint(&d, &w).unwrap_err().to_string();
    assert!(e.contains("tensor `1.t` is i32 [] in the checkpoint, but the program expects f32 []"), "{e}");
    let mut w = wanted(&sample());
    w[2].name = "1.n".to_string();
    let e = read_checkpoint(&d, &w).unwrap_err().to_string();
    assert!(e.contains("has no tensor `1.n`"), "{e}");
    let w = wanted(&sample()[..3]);
    let e = read_checkpoint(&d, &w).unwrap_err().to_string();
    assert!(e.contains("holds tensors the program's type does not have: `2`"), "{e}");
    std::fs::remove_file(d.join(INDEX)).unwrap();
    let e = read_checkpoint(&d, &wanted(&sample())).unwrap_err().to_string();
    assert!(e.contains("incomplete checkpoint"), "{e}");
    assert!(!is_complete(&d));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn damage_is_found() {
    let d = scratch("damage");
    write_checkpoint(&d, &sample()).unwrap();
    let index = read_index(&d).unwrap();
    let data = d.join(&index.files[0].name);
    let mut bytes = std::fs::read(&data).unwrap();
    let at = index.tensors[0].shards[0].bytes[0] as usize;
    bytes[at] ^= 1;
    std::fs::write(&data, &bytes).unwrap();
    let e = read_checkpoint(&d, &wanted(&sample())).unwrap_err().to_string();
    assert!(e.contains("tensor `0.w`: its data does not match its checksum"), "{e}");
    bytes[at] ^= 1;
    bytes[20] = b'X';
    std::fs::write(&data, &bytes).unwrap();
    let e = read_checkpoint(&d, &wanted(&sample())).unwrap_err().to_string();
    assert!(e.contains("the safetensors header of rank0."), "{e}");
    bytes.pop();
    std::fs::write(&data, &bytes).unwrap();
    let e = read_checkpoint(&d, &wanted(&sample())).unwrap_err().to_string();
    assert!(e.contains("bytes, but the index says"), "{e}");
    std::fs::write(d.join(INDEX), b"{\"format\": 3").unwrap();
    let e = read_checkpoint(&d, &wanted(&sample())).unwrap_err().to_string();
    assert!(e.contains("damaged checkpoint index"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn shards_are_assembled() {
    // A [4, 3] tensor in two row blocks of one file, as two ranks of `dp` would save it.
    let d = scratch("shards");
    std::fs::create_dir_all(&d).unwrap();
    let v: Vec<f32> = (0..12).map(|i| i as f32).collect();
    // An empty header (length 0), then the data.
    let bytes: Vec<u8> = [0u8; 8].into_iter().chain(v.iter().flat_map(|x| x.to_le_bytes())).collect();
    std::fs::write(d.join("rank0.00000000.safetensors"), &bytes).unwrap();
    let crc = |b: &[u8]| crc32fast::hash(b);
    let shard = |start: usize, lo: usize, hi: usize| Shard {
        file: 0,
        start: vec![start, 0],
        shape: vec![2, 3],
        bytes: [lo as u64, hi as u64],
        crc32: crc(&bytes[lo..hi]),
        chunk: None,
        chunk_crc32: Vec::new(),
    };
    let mut index = Index {
        format: FORMAT.into(),
        version: VERSION,
        mesh: Some(vec![MeshAxis { name: "dp".into(), size: 2 }]),
        files: vec![FileEntry {
            name: "rank0.00000000.safetensors".into(),
            rank: 0,
            size: 56,
            header_crc32: crc(&[0; 8]),
        }],
        tensors: vec![TensorEntry {
            name: "w".into(),
            dtype: "F32".into(),
            shape: vec![4, 3],
            layout: vec![vec!["dp".into()], vec![]],
            shards: vec![shard(2, 32, 56), shard(0, 8, 32)],
        }],
    };
    std::fs::write(d.join(INDEX), serde_json::to_string(&index).unwrap()).unwrap();
    let w = [Wanted { name: "w".into(), dtype: DType::F32, shape: vec![Some(4), Some(3)], group: None, region: None }];
    assert_eq!(read_checkpoint(&d, &w).unwrap()[0], Tensor::from_f32(vec![4, 3], v).unwrap());
    index.tensors[0].shards[0].start = vec![0, 0];
    std::fs::write(d.join(INDEX), serde_json::to_string(&index).unwrap()).unwrap();
    let e = read_checkpoint(&d, &w).unwrap_err().to_string();
    assert!(e.contains("overlap"), "{e}");
    index.tensors[0].shards.pop();
    std::fs::write(d.join(INDEX), serde_json::to_string(&index).unwrap()).unwrap();
    let e = read_checkpoint(&d, &w).unwrap_err().to_string();
    assert!(e.contains("do not cover it"), "{e}");
    index.tensors[0].shards = vec![shard(0, 8, 32), shard(2, 8, 32)];
    std::fs::write(d.join(INDEX), serde_json::to_string(&index).unwrap()).unwrap();
    let e = read_checkpoint(&d, &w).unwrap_err().to_string();
    assert!(e.contains("two of its shards share bytes"), "{e}");
    index.tensors[0].shards = vec![shard(0, 8, 32), shard(2, 32, 56)];
    index.files[0].name = "../x".into();
    std::fs::write(d.join(INDEX), serde_json::to_string(&index).unwrap()).unwrap();
    let e = read_checkpoint(&d, &w).unwrap_err().to_string();
    assert!(e.contains("the index names the file '../x'"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_index_text_parses_back() {
    let d = scratch("text");
    write_checkpoint(&d, &sample()).unwrap();
    let text = std::fs::read_to_string(d.join(INDEX)).unwrap();
    assert!(text.contains("\n    {\"name\":\"0.w\",\"dtype\":\"F32\",\"shape\":[2,3],\"layout\":[[],[]],"), "{text}");
    let index = read_index(&d).unwrap();
    assert_eq!(index_text(&index).unwrap(), text);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn leftover_names() {
    assert!(is_data_file("rank0.0123abcd.safetensors"));
    assert!(is_data_file("rank12.ffffffff.safetensors"));
    assert!(!is_data_file("rank0.safetensors") && !is_data_file("model.safetensors"));
    assert_eq!(temp_owner(".rank0.safetensors.123.4.tmp"), Some(123));
    assert_eq!(temp_owner(".index.json.77.0.tmp"), Some(77));
    assert_eq!(temp_owner(".notes.txt.77.0.tmp"), None);
    assert!(alive(std::process::id()));
}

/// A tensor saved as two row blocks by two ranks reads back whole, and any block of it
/// reads back as that block of the whole (from the shards that overlap it only).
#[test]
fn a_sharded_checkpoint_reads_whole_or_by_block() {
    let dir = scratch("blocks");
    prepare_checkpoint(&dir).unwrap();
    let whole: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let top = Tensor::from_f32(vec![2, 6], whole[..12].to_vec()).unwrap();
    let bottom = Tensor::from_f32(vec![2, 6], whole[12..].to_vec()).unwrap();
    let (f0, mut s0) = write_data_file(&dir, 0, &[("w".into(), top)]).unwrap();
    let (f1, mut s1) = write_data_file(&dir, 1, &[("w".into(), bottom)]).unwrap();
    let (a, mut b) = (s0.remove(0), s1.remove(0));
    b.file = 1;
    b.start = vec![2, 0];
    let index = Index {
        format: FORMAT.into(),
        version: VERSION,
        mesh: Some(vec![MeshAxis { name: "dp".into(), size: 2 }]),
        files: vec![f0, f1],
        tensors: vec![TensorEntry {
            name: "w".into(),
            dtype: "F32".into(),
            shape: vec![4, 6],
            layout: vec![vec!["dp".into()], vec![]],
            shards: vec![a, b],
        }],
    };
    write_index(&dir, &index).unwrap();
    let want =
        |region| Wanted { name: "w".into(), dtype: DType::F32, shape: vec![Some(4), Some(6)], group: None, region };
    let t = read_checkpoint(&dir, &[want(None)]).unwrap();
    assert_eq!(t[0].as_f32().unwrap(), &whole[..]);
    let t = read_checkpoint(&dir, &[want(Some((vec![1, 2], vec![2, 3])))]).unwrap();
    assert_eq!(t[0].shape(), &[2, 3]);
    assert_eq!(t[0].as_f32().unwrap(), &[8.0, 9.0, 10.0, 14.0, 15.0, 16.0]);
    let t = read_checkpoint(&dir, &[want(Some((vec![2, 0], vec![2, 6])))]).unwrap();
    assert_eq!(t[0].as_f32().unwrap(), &whole[12..]);
    assert!(read_checkpoint(&dir, &[want(Some((vec![3, 0], vec![2, 6])))]).is_err(), "a block past the end");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A long shard is checksummed in pieces of [`CHUNK`] bytes, and a block of it reads only the
/// pieces that hold the block: damage in another piece goes unnoticed by that read (it reads
/// none of those bytes) and is reported by a read that needs it.
#[test]
fn a_block_of_a_long_shard_reads_only_its_pieces() {
    let dir = scratch("pieces");
    prepare_checkpoint(&dir).unwrap();
    // [1024, 1024] f32: 4 MiB, four pieces of 256 rows each.
    let whole: Vec<f32> = (0..1 << 20).map(|i| i as f32).collect();
    let t = Tensor::from_f32(vec![1024, 1024], whole.clone()).unwrap();
    let (file, mut shards) = write_data_file(&dir, 0, &[("w".into(), t)]).unwrap();
    let shard = shards.remove(0);
    assert_eq!(shard.chunk, Some(CHUNK));
    assert_eq!(shard.chunk_crc32.len(), 4);
    let begin = shard.bytes[0];
    let index = Index {
        format: FORMAT.into(),
        version: VERSION,
        mesh: None,
        files: vec![file.clone()],
        tensors: vec![TensorEntry {
            name: "w".into(),
            dtype: "F32".into(),
            shape: vec![1024, 1024],
            layout: vec![vec![], vec![]],
            shards: vec![shard],
        }],
    };
    write_index(&dir, &index).unwrap();
    let want = |region| {
        [Wanted { name: "w".into(), dtype: DType::F32, shape: vec![Some(1024), Some(1024)], group: None, region }]
    };
    // Rows 300..310, columns 5..8: inside the second piece.
    let t = read_checkpoint(&dir, &want(Some((vec![300, 5], vec![10, 3])))).unwrap();
    let expect: Vec<f32> = (300..310).flat_map(|r| (5..8).map(move |c| (r * 1024 + c) as f32)).collect();
    assert_eq!(t[0].as_f32().unwrap(), &expect[..]);
    // Damage one byte of the last piece (row 900).
    let path = dir.join(&file.name);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(begin + 900 * 4096) as usize] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let t = read_checkpoint(&dir, &want(Some((vec![0, 0], vec![512, 1024])))).unwrap();
    assert_eq!(t[0].as_f32().unwrap(), &whole[..512 * 1024]);
    for region in [Some((vec![700, 0], vec![300, 1024])), None] {
        let e = read_checkpoint(&dir, &want(region)).unwrap_err().to_string();
        assert!(e.contains("does not match its checksum"), "{e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
